/* Devices: streams, events, errors, memory, and the two synchronisation
 * strategies (engine/device.h), on cpu and sim places. */
#define _GNU_SOURCE
#include <check.h>
#include <omp.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "engine/device.h"
#include "engine/place_io.h"
#include "test_assert.h"

static pe_device *open_dev(pe_place_kind kind, int id, int threads) {
  pe_device *d = NULL;
  pe_device_opts o = {.threads = threads};
  pe_status *st = pe_device_open((pe_place){kind, id}, &o, &d);
  ck_assert_msg(!st, "%s", pe_status_msg(st));
  return d;
}

/* --- in-order execution ------------------------------------------------------- */

typedef struct seq_log {
  int n; /* written only by the stream thread */
  int vals[2000];
} seq_log;

typedef struct seq_item {
  seq_log *log;
  int v;
} seq_item;

static pe_status *append(void *arg) {
  seq_item *it = arg;
  it->log->vals[it->log->n++] = it->v;
  return NULL;
}

START_TEST(sim_stream_runs_in_order) {
  pe_device *d = open_dev(PE_PLACE_SIM, 0, 1);
  ck_assert(pe_device_is_async(d));
  static seq_log log;
  static seq_item items[1000];
  static int src[1000], dst[1000];
  pe_stream *s = pe_device_stream(d, PE_STREAM_COMPUTE);
  for (int i = 0; i < 1000; i++) {
    items[i] = (seq_item){&log, i};
    src[i] = i * 3;
    ck_assert_ptr_null(pe_stream_launch(s, append, &items[i]));
    /* Copies are queued in the same order as kernels. */
    ck_assert_ptr_null(pe_stream_copy(s, &dst[i], &src[i], sizeof(int), PE_COPY_D2D));
  }
  ck_assert_ptr_null(pe_stream_sync(s));
  ck_assert_int_eq(log.n, 1000);
  for (int i = 0; i < 1000; i++) {
    ck_assert_int_eq(log.vals[i], i);
    ck_assert_int_eq(dst[i], i * 3);
  }
  pe_device_close(d);
}
END_TEST

static pe_status *set_flag(void *arg) {
  atomic_store_explicit((_Atomic int *)arg, 1, memory_order_relaxed);
  return NULL;
}

START_TEST(cpu_launch_is_synchronous) {
  pe_device *d = open_dev(PE_PLACE_CPU, 1, 2);
  ck_assert(!pe_device_is_async(d));
  ck_assert_str_eq(pe_device_stream(d, PE_STREAM_COMM)->name, "cpu:1/comm");
  ck_assert_int_eq(pe_stream_ctx(pe_device_stream(d, PE_STREAM_COMPUTE))->threads, 2);
  _Atomic int flag = 0;
  pe_stream *s = pe_device_stream(d, PE_STREAM_COMPUTE);
  ck_assert_ptr_null(pe_stream_launch(s, set_flag, &flag));
  ck_assert_int_eq(atomic_load(&flag), 1); /* already ran */
  pe_event *e;
  ck_assert_ptr_null(pe_event_get(d, &e));
  ck_assert_ptr_null(pe_event_record(e, s));
  ck_assert(pe_event_query(e));
  ck_assert_ptr_null(pe_event_sync(e));
  pe_event_put(e);
  int a = 5, b = 0;
  ck_assert_ptr_null(pe_stream_copy(s, &b, &a, sizeof a, PE_COPY_H2D));
  ck_assert_int_eq(b, 5);
  ck_assert_ptr_null(pe_stream_sync(s));
  pe_device_close(d);
}
END_TEST

/* --- cross-stream dependencies ---------------------------------------------------- */

enum { HANG_GUARD_MS = 10000 };

/* Checked without timing the host: with PE_SYNC_WAIT_PRODUCER the host
 * must see the producer's write as soon as sync_dep returned (the producer
 * sleeps first, so a host that did not wait reads 0); with
 * PE_SYNC_WAIT_EVENT the producer waits for a gate that the host opens
 * only after sync_dep returned, so a sync_dep that blocked the host would
 * hold both until the producer gives up (HANG_GUARD_MS, which only bounds
 * a broken strategy) and reports it. */
typedef struct dep_case {
  int *buf; /* producer writes, consumer reads */
  int seen; /* consumer's copy */
  int sleep_ms;
  bool gated;      /* wait for `open` instead of sleeping */
  atomic_int open; /* set by the host */
  bool gave_up;    /* the gate stayed closed for HANG_GUARD_MS */
} dep_case;

static pe_status *slow_producer(void *arg) {
  dep_case *c = arg;
  if (c->gated) {
    int ms = 0;
    while (!atomic_load_explicit(&c->open, memory_order_acquire) && ms < HANG_GUARD_MS) {
      usleep(1000);
      ms++;
    }
    c->gave_up = !atomic_load_explicit(&c->open, memory_order_acquire);
  } else {
    usleep((useconds_t)c->sleep_ms * 1000);
  }
  *c->buf = 42;
  return NULL;
}

static pe_status *consumer(void *arg) {
  dep_case *c = arg;
  c->seen = *c->buf;
  return NULL;
}

/* Producer on `ps`, consumer on `cs`, joined by pe_device_sync_dep. */
static void run_dep(pe_sync_strategy strat, pe_stream *ps, pe_stream *cs, bool with_event) {
  int *buf = calloc(1, sizeof(int));
  bool producer = strat == PE_SYNC_WAIT_PRODUCER;
  dep_case c = {.buf = buf, .seen = -1, .sleep_ms = 150, .gated = !producer};
  pe_event *e = NULL;
  ck_assert_ptr_null(pe_stream_launch(ps, slow_producer, &c));
  if (with_event) {
    ck_assert_ptr_null(pe_event_get(ps->dev, &e));
    ck_assert_ptr_null(pe_event_record(e, ps));
  }
  ck_assert_ptr_null(pe_device_sync_dep(strat, ps, e, cs));
  if (producer) {
    ck_assert_msg(*buf == 42, "host should have waited for the producer (it read %d)", *buf);
  } else {
    atomic_store_explicit(&c.open, 1, memory_order_release);
  }
  /* The event may go back to the pool before the consumer runs. */
  pe_event_put(e);
  ck_assert_ptr_null(pe_stream_launch(cs, consumer, &c));
  ck_assert_ptr_null(pe_stream_sync(cs));
  ck_assert_int_eq(c.seen, 42);
  ck_assert_ptr_null(pe_stream_sync(ps));
  ck_assert_msg(!c.gave_up,
                "event wait must not block the host: the producer waited %d ms for "
                "the host to return",
                HANG_GUARD_MS);
  free(buf);
}

START_TEST(sim_cross_stream_dependency_both_strategies) {
  pe_device *d0 = open_dev(PE_PLACE_SIM, 0, 1), *d1 = open_dev(PE_PLACE_SIM, 1, 1);
  for (int strat = 0; strat < 2; strat++) {
    for (int ev = 0; ev < 2; ev++) {
      /* same device, compute -> comm (an all-reduce after backward) */
      run_dep((pe_sync_strategy)strat, pe_device_stream(d0, PE_STREAM_COMPUTE),
              pe_device_stream(d0, PE_STREAM_COMM), ev);
      /* across devices: sim:0 compute -> sim:1 copy */
      run_dep((pe_sync_strategy)strat, pe_device_stream(d0, PE_STREAM_COMPUTE),
              pe_device_stream(d1, PE_STREAM_H2D), ev);
    }
  }
  pe_device_close(d0);
  pe_device_close(d1);
}
END_TEST

START_TEST(cpu_consumer_of_sim_producer_blocks_host) {
  pe_device *sim = open_dev(PE_PLACE_SIM, 0, 1), *cpu = open_dev(PE_PLACE_CPU, 0, 1);
  run_dep(PE_SYNC_WAIT_PRODUCER, pe_device_stream(sim, PE_STREAM_COMPUTE),
          pe_device_stream(cpu, PE_STREAM_COMPUTE), true);
  /* Event strategy to a synchronous consumer: the cpu "stream" is the
   * calling thread, so the wait itself blocks it. */
  int *buf = calloc(1, sizeof(int));
  dep_case c = {.buf = buf, .seen = -1, .sleep_ms = 100};
  pe_stream *ps = pe_device_stream(sim, PE_STREAM_COMPUTE);
  ck_assert_ptr_null(pe_stream_launch(ps, slow_producer, &c));
  ck_assert_ptr_null(
      pe_device_sync_dep(PE_SYNC_WAIT_EVENT, ps, NULL, pe_device_stream(cpu, PE_STREAM_COMPUTE)));
  ck_assert_ptr_null(pe_stream_launch(pe_device_stream(cpu, PE_STREAM_COMPUTE), consumer, &c));
  ck_assert_int_eq(c.seen, 42);
  /* A cpu producer is complete already: nothing to do either way. */
  ck_assert_ptr_null(pe_device_sync_dep(PE_SYNC_WAIT_EVENT, pe_device_stream(cpu, 0), NULL, ps));
  ck_assert_ptr_null(pe_stream_sync(ps));
  free(buf);
  pe_device_close(cpu);
  pe_device_close(sim);
}
END_TEST

/* --- events ------------------------------------------------------------------------ */

static pe_status *wait_gate(void *arg) {
  _Atomic int *gate = arg;
  while (!atomic_load_explicit(gate, memory_order_acquire)) usleep(1000);
  return NULL;
}

START_TEST(sim_event_query_and_sync) {
  pe_device *d = open_dev(PE_PLACE_SIM, 0, 1);
  pe_stream *s = pe_device_stream(d, PE_STREAM_COMPUTE);
  pe_event *e, *never;
  ck_assert_ptr_null(pe_event_get(d, &e));
  ck_assert_ptr_null(pe_event_get(d, &never));
  ck_assert(pe_event_query(never)); /* never recorded: complete */
  _Atomic int gate = 0;
  ck_assert_ptr_null(pe_stream_launch(s, wait_gate, &gate));
  ck_assert_ptr_null(pe_event_record(e, s));
  usleep(20000);
  ck_assert(!pe_event_query(e));
  atomic_store_explicit(&gate, 1, memory_order_release);
  ck_assert_ptr_null(pe_event_sync(e));
  ck_assert(pe_event_query(e));
  /* Recording on another device's stream is refused. */
  pe_device *d2 = open_dev(PE_PLACE_SIM, 1, 1);
  pe_status *st = pe_event_record(e, pe_device_stream(d2, PE_STREAM_COMPUTE));
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  /* The pool hands back the same event. */
  pe_event_put(e);
  pe_event *e2;
  ck_assert_ptr_null(pe_event_get(d, &e2));
  ck_assert_ptr_eq(e, e2);
  ck_assert(pe_event_query(e2));
  pe_event_put(e2);
  pe_event_put(never);
  pe_device_close(d2);
  pe_device_close(d);
}
END_TEST

/* --- errors ------------------------------------------------------------------------ */

static pe_status *fail_fn(void *arg) {
  return pe_error(PE_EBACKEND, "kernel %s failed", (char *)arg);
}

static void check_async_error(pe_device *d) {
  pe_stream *s = pe_device_stream(d, PE_STREAM_COMPUTE);
  pe_event *before, *after, *later;
  ck_assert_ptr_null(pe_event_get(d, &before));
  ck_assert_ptr_null(pe_event_get(d, &after));
  ck_assert_ptr_null(pe_event_get(d, &later));
  _Atomic int ran = 0;
  ck_assert_ptr_null(pe_event_record(before, s));
  ck_assert_ptr_null(pe_stream_launch(s, fail_fn, "first")); /* launch itself succeeds */
  ck_assert_ptr_null(pe_event_record(after, s));
  ck_assert_ptr_null(pe_stream_launch(s, fail_fn, "second"));
  ck_assert_ptr_null(pe_stream_launch(s, set_flag, (void *)&ran));
  ck_assert_ptr_null(pe_event_record(later, s));
  ck_assert_ptr_null(pe_event_sync(before)); /* the error came after it */
  pe_status *st = pe_event_sync(after);
  ck_assert_int_eq(pe_status_code(st), PE_EBACKEND);
  ck_assert_str_eq(pe_status_msg(st), "kernel first failed");
  pe_status_free(st);
  st = pe_event_sync(later); /* event sync does not clear */
  ck_assert_str_eq(pe_status_msg(st), "kernel first failed");
  pe_status_free(st);
  ck_assert_int_eq(atomic_load(&ran), 1); /* later work still ran */
  st = pe_stream_sync(s);                 /* the first error, once */
  ck_assert_int_eq(pe_status_code(st), PE_EBACKEND);
  ck_assert_str_eq(pe_status_msg(st), "kernel first failed");
  pe_status_free(st);
  ck_assert_ptr_null(pe_stream_sync(s));
  ck_assert_ptr_null(pe_event_sync(later)); /* taken */
  pe_event_put(before);
  pe_event_put(after);
  pe_event_put(later);
}

START_TEST(async_error_surfaces_on_sync) {
  pe_device *sim = open_dev(PE_PLACE_SIM, 0, 1), *cpu = open_dev(PE_PLACE_CPU, 0, 1);
  check_async_error(sim);
  check_async_error(cpu);
  pe_device_close(sim);
  pe_device_close(cpu);
}
END_TEST

/* --- memory ------------------------------------------------------------------------ */

START_TEST(caching_allocator_reuses_blocks) {
  pe_device *d = open_dev(PE_PLACE_SIM, 0, 1);
  size_t cap, cap2;
  void *p = pe_device_alloc(d, 1000, &cap);
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_ge(cap, 1000);
  pe_device_free(d, p, cap);
  void *q = pe_device_alloc(d, 900, &cap2);
  ck_assert_ptr_eq(p, q);
  pe_alloc_stats s = pe_allocator_stats(pe_device_allocator(d));
  ck_assert_uint_eq(s.n_alloc, 2);
  ck_assert_uint_eq(s.n_system, 1);
  pe_device_free(d, q, cap2);
  pe_device_close(d);
}
END_TEST

START_TEST(sim_copies_h2d_d2h) {
  pe_device *d = open_dev(PE_PLACE_SIM, 0, 1);
  enum { N = 100000 };
  float *host = malloc(N * sizeof(float)), *back = calloc(N, sizeof(float));
  for (int i = 0; i < N; i++) host[i] = (float)i;
  size_t cap;
  float *dev = pe_device_alloc(d, N * sizeof(float), &cap);
  pe_stream *h2d = pe_device_stream(d, PE_STREAM_H2D), *d2h = pe_device_stream(d, PE_STREAM_D2H);
  ck_assert_ptr_null(pe_stream_copy(h2d, dev, host, N * sizeof(float), PE_COPY_H2D));
  ck_assert_ptr_null(pe_device_sync_dep(PE_SYNC_WAIT_EVENT, h2d, NULL, d2h));
  ck_assert_ptr_null(pe_stream_copy(d2h, back, dev, N * sizeof(float), PE_COPY_D2H));
  ck_assert_ptr_null(pe_stream_sync(d2h));
  ck_assert_int_eq(memcmp(host, back, N * sizeof(float)), 0);
  ck_assert_ptr_null(pe_stream_sync(h2d));
  pe_device_free(d, dev, cap);
  free(host);
  free(back);
  pe_device_close(d);
}
END_TEST

/* pe_place_read / write / zero on a sim device opened with the
 * device_memory hook (copies on its copy streams, as on cuda) and on cpu
 * (plain copies): round trips, zeroing across several zero blocks without
 * touching the byte after, and a failure kept on the d2h stream reported
 * with the variable, its shape and the place. */
static void check_place_io(pe_device *d) {
  enum { N = 100000 };
  float *v = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) v[i] = (float)i * 0.5f;
  pe_tensor host, dev, back;
  pe_tensor_init(&host);
  pe_tensor_init(&dev);
  pe_tensor_init(&back);
  pe_shape sh = PE_SHAPE(N);
  pe_tensor_view(&host, PE_F32, &sh, v);
  PE_CK_OK(pe_place_write(d, &dev, &host, "w"));
  ck_assert_ptr_eq(dev.alloc, pe_device_allocator(d)); /* lives in the device's memory */
  PE_CK_OK(pe_place_read(d, &dev, &back, "w"));
  ck_assert(pe_shape_equal(&back.shape, &sh));
  ck_assert_int_eq(memcmp(back.data, v, N * sizeof(float)), 0);
  /* Zero all but the last element: 3 full zero blocks and a partial one. */
  size_t bytes = (N - 1) * sizeof(float);
  ck_assert_uint_gt(bytes, 3 * 65536);
  PE_CK_OK(pe_place_zero(d, dev.data, bytes, "w"));
  PE_CK_OK(pe_place_read(d, &dev, &back, "w"));
  int64_t nonzero = 0;
  for (int i = 0; i < N - 1; i++) nonzero += pe_f32(&back)[i] != 0.0f;
  ck_assert_int_eq(nonzero, 0);
  ck_assert_float_eq(pe_f32(&back)[N - 1], (float)(N - 1) * 0.5f);
  /* A failure kept on the d2h stream comes back from the read, named. */
  char want[64];
  pe_place_str(d->place, want, sizeof want);
  ck_assert_ptr_null(pe_stream_launch(pe_device_stream(d, PE_STREAM_D2H), fail_fn, "d2h"));
  pe_status *st = pe_place_read(d, &dev, &back, "w");
  if (pe_device_host_memory(d)) {
    ck_assert_ptr_null(st); /* a plain copy: the stream is not involved */
    pe_status_free(pe_stream_sync(pe_device_stream(d, PE_STREAM_D2H)));
  } else {
    expect_errors(st, PE_EBACKEND, "kernel d2h failed", "reading 'w'", "f32 [100000]", want,
                  (const char *)NULL);
    PE_CK_OK(pe_place_read(d, &dev, &back, "w")); /* the error was taken */
  }
  pe_tensor_release(&dev);
  pe_tensor_release(&back);
  free(v);
}

START_TEST(place_io_device_memory_and_host) {
  pe_device *sim = NULL;
  pe_device_opts o = {.threads = 1, .device_memory = 1};
  PE_CK_OK(pe_device_open((pe_place){PE_PLACE_SIM, 0}, &o, &sim));
  ck_assert(!pe_device_host_memory(sim));
  pe_device *cpu = open_dev(PE_PLACE_CPU, 0, 1), *plain = open_dev(PE_PLACE_SIM, 1, 1);
  ck_assert(pe_device_host_memory(cpu) && pe_device_host_memory(plain));
  check_place_io(sim);
  check_place_io(cpu);
  check_place_io(plain);
  pe_device_close(sim);
  pe_device_close(cpu);
  pe_device_close(plain);
}
END_TEST

/* --- kernel context ------------------------------------------------------------------- */

typedef struct ctx_probe {
  pe_stream *s;
  int omp_threads, ctx_threads;
} ctx_probe;

static pe_status *probe(void *arg) {
  ctx_probe *p = arg;
  p->omp_threads = omp_get_max_threads();
  p->ctx_threads = pe_stream_ctx(p->s)->threads;
  return NULL;
}

START_TEST(sim_stream_threads_bind_budget) {
  pe_device *d = open_dev(PE_PLACE_SIM, 2, 3);
  ctx_probe p[PE_STREAM_KINDS];
  for (int k = 0; k < PE_STREAM_KINDS; k++) {
    p[k].s = pe_device_stream(d, (pe_stream_kind)k);
    ck_assert_ptr_null(pe_stream_launch(p[k].s, probe, &p[k]));
  }
  for (int k = 0; k < PE_STREAM_KINDS; k++) ck_assert_ptr_null(pe_stream_sync(p[k].s));
  ck_assert_int_eq(p[PE_STREAM_COMPUTE].omp_threads, 3);
  ck_assert_int_eq(p[PE_STREAM_COMM].omp_threads, 3);
  ck_assert_int_eq(p[PE_STREAM_H2D].omp_threads, 1);
  ck_assert_int_eq(p[PE_STREAM_COMPUTE].ctx_threads, 3);
  ck_assert_str_eq(pe_device_stream(d, PE_STREAM_D2H)->name, "sim:2/d2h");
  pe_device_close(d);
}
END_TEST

/* --- many streams at once, waits in a chain -------------------------------------------- */

static pe_status *bump(void *arg) {
  long *v = arg;
  (*v)++;
  return NULL;
}

START_TEST(sim_wait_chain_across_devices) {
  /* A value is incremented by a kernel on each of 4 devices x 2 streams in
   * turn, 200 rounds, each hop joined by an event wait: the total is only
   * right if every wait orders its hop. */
  enum { D = 4, ROUNDS = 200 };
  pe_device *d[D];
  for (int i = 0; i < D; i++) d[i] = open_dev(PE_PLACE_SIM, i, 1);
  long *cell = calloc(1, sizeof(long));
  pe_stream *prev = NULL;
  pe_event *e[D];
  for (int i = 0; i < D; i++) ck_assert_ptr_null(pe_event_get(d[i], &e[i]));
  for (int r = 0; r < ROUNDS; r++) {
    int i = r % D;
    pe_stream *s = pe_device_stream(d[i], (r / D) % 2 ? PE_STREAM_COMM : PE_STREAM_COMPUTE);
    if (prev) {
      int pi = (r - 1) % D;
      ck_assert_ptr_null(pe_event_record(e[pi], prev));
      ck_assert_ptr_null(
          pe_device_sync_dep(r % 3 ? PE_SYNC_WAIT_EVENT : PE_SYNC_WAIT_PRODUCER, prev, e[pi], s));
    }
    ck_assert_ptr_null(pe_stream_launch(s, bump, cell));
    prev = s;
  }
  ck_assert_ptr_null(pe_stream_sync(prev));
  ck_assert_int_eq(*cell, ROUNDS);
  for (int i = 0; i < D; i++) {
    pe_event_put(e[i]);
    pe_device_close(d[i]);
  }
  free(cell);
}
END_TEST

START_TEST(open_close_and_names) {
  for (int i = 0; i < 20; i++) pe_device_close(open_dev(PE_PLACE_SIM, i % 4, 1));
  pe_device *d = NULL;
  pe_status *st = pe_device_open((pe_place){PE_PLACE_CUDA, 0}, NULL, &d);
#ifdef PE_HAVE_CUDA
  /* Built in: no GPU is a backend error (tests/cuda/test_cuda_build.c); a GPU opens. */
  if (d) {
    pe_device_close(d);
    d = NULL;
  } else {
    ck_assert_int_eq(pe_status_code(st), PE_EBACKEND);
  }
#else
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
#endif
  ck_assert_ptr_null(d);
  pe_status_free(st);
  pe_sync_strategy s;
  ck_assert(pe_sync_strategy_parse("producer", &s) && s == PE_SYNC_WAIT_PRODUCER);
  ck_assert(pe_sync_strategy_parse("event", &s) && s == PE_SYNC_WAIT_EVENT);
  ck_assert(!pe_sync_strategy_parse("later", &s));
  ck_assert_str_eq(pe_sync_strategy_name(PE_SYNC_WAIT_PRODUCER), "producer");
  pe_device_close(NULL);
}
END_TEST

static Suite *device_suite(void) {
  Suite *s = suite_create("device");
  TCase *tc = tcase_create("device");
  tcase_add_test(tc, sim_stream_runs_in_order);
  tcase_add_test(tc, cpu_launch_is_synchronous);
  tcase_add_test(tc, sim_cross_stream_dependency_both_strategies);
  tcase_add_test(tc, cpu_consumer_of_sim_producer_blocks_host);
  tcase_add_test(tc, sim_event_query_and_sync);
  tcase_add_test(tc, async_error_surfaces_on_sync);
  tcase_add_test(tc, caching_allocator_reuses_blocks);
  tcase_add_test(tc, sim_copies_h2d_d2h);
  tcase_add_test(tc, place_io_device_memory_and_host);
  tcase_add_test(tc, sim_stream_threads_bind_budget);
  tcase_add_test(tc, sim_wait_chain_across_devices);
  tcase_add_test(tc, open_close_and_names);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(device_suite)
