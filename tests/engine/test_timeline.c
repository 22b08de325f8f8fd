/* Timeline: spans from several threads (and from sim stream threads) come
 * out as well-formed Chrome trace JSON with the right events. */
#define _GNU_SOURCE
#include <check.h>
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "engine/device.h"
#include "engine/timeline.h"

/* --- a small JSON syntax checker (RFC 8259 grammar, no semantics) -------------- */

typedef struct jp {
  const char *p;
  int depth;
} jp;

static void ws(jp *j) {
  while (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t') j->p++;
}

static bool value(jp *j);

static bool string(jp *j) {
  if (*j->p != '"') return false;
  j->p++;
  while (*j->p != '"') {
    unsigned char c = (unsigned char)*j->p;
    if (c < 0x20) return false; /* includes the terminating NUL */
    if (c == '\\') {
      j->p++;
      if (*j->p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!isxdigit((unsigned char)j->p[i])) return false;
        j->p += 4;
      } else if (!strchr("\"\\/bfnrt", *j->p) || !*j->p) {
        return false;
      }
    }
    j->p++;
  }
  j->p++;
  return true;
}

static bool number(jp *j) {
  const char *s = j->p;
  if (*j->p == '-') j->p++;
  if (*j->p == '0')
    j->p++;
  else if (isdigit((unsigned char)*j->p))
    while (isdigit((unsigned char)*j->p)) j->p++;
  else
    return false;
  if (*j->p == '.') {
    j->p++;
    if (!isdigit((unsigned char)*j->p)) return false;
    while (isdigit((unsigned char)*j->p)) j->p++;
  }
  if (*j->p == 'e' || *j->p == 'E') {
    j->p++;
    if (*j->p == '+' || *j->p == '-') j->p++;
    if (!isdigit((unsigned char)*j->p)) return false;
    while (isdigit((unsigned char)*j->p)) j->p++;
  }
  return j->p > s;
}

static bool seq(jp *j, char close, bool object) {
  j->p++;
  if (++j->depth > 64) return false;
  ws(j);
  if (*j->p == close) {
    j->p++;
    j->depth--;
    return true;
  }
  for (;;) {
    ws(j);
    if (object) {
      if (!string(j)) return false;
      ws(j);
      if (*j->p++ != ':') return false;
    }
    if (!value(j)) return false;
    ws(j);
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p++ != close) return false;
    j->depth--;
    return true;
  }
}

static bool value(jp *j) {
  ws(j);
  switch (*j->p) {
    case '{': return seq(j, '}', true);
    case '[': return seq(j, ']', false);
    case '"': return string(j);
    case 't': return strncmp(j->p, "true", 4) == 0 && (j->p += 4);
    case 'f': return strncmp(j->p, "false", 5) == 0 && (j->p += 5);
    case 'n': return strncmp(j->p, "null", 4) == 0 && (j->p += 4);
    default: return number(j);
  }
}

static bool json_valid(const char *s) {
  jp j = {s, 0};
  if (!value(&j)) return false;
  ws(&j);
  return *j.p == 0;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

START_TEST(json_checker_sanity) {
  ck_assert(json_valid("{\"a\":[1,-2.5e3,\"x\\\"y\\u00e9\",true,null,{}],\"b\":{}}"));
  ck_assert(!json_valid("{\"a\":[1,2,]}"));
  ck_assert(!json_valid("{\"a\" 1}"));
  ck_assert(!json_valid("[\"unterminated]"));
  ck_assert(!json_valid("{} x"));
}
END_TEST

/* --- spans from several threads --------------------------------------------------- */

typedef struct rec_arg {
  pe_timeline *tl;
  int id;
  int n;
} rec_arg;

static void *recorder(void *arg) {
  rec_arg *a = arg;
  char lane[32], name[32];
  snprintf(lane, sizeof lane, "worker %d", a->id);
  pe_tl_lane *l = pe_timeline_thread_lane(a->tl, lane);
  ck_assert_ptr_eq(l, pe_timeline_thread_lane(a->tl, "again")); /* cached */
  for (int i = 0; i < a->n; i++) {
    uint64_t t0 = pe_timeline_now_ns();
    snprintf(name, sizeof name, "op%d_%d", a->id, i);
    pe_timeline_record(l, (pe_place){PE_PLACE_CPU, a->id % 2}, name, t0, pe_timeline_now_ns());
  }
  return NULL;
}

START_TEST(threads_record_and_json_parses) {
  enum { T = 4, N = 100 };
  pe_timeline *tl;
  ck_assert_ptr_null(pe_timeline_new(8, 1000, &tl));
  pthread_t th[T];
  rec_arg args[T];
  for (int i = 0; i < T; i++) {
    args[i] = (rec_arg){tl, i, N};
    ck_assert_int_eq(pthread_create(&th[i], NULL, recorder, &args[i]), 0);
  }
  /* Writing while they record sees only whole spans. */
  char *mid;
  ck_assert_ptr_null(pe_timeline_json(tl, &mid, NULL));
  ck_assert(json_valid(mid));
  free(mid);
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  ck_assert_uint_eq(pe_timeline_spans(tl), T * N);
  ck_assert_uint_eq(pe_timeline_dropped(tl), 0);

  char path[] = "/tmp/pe_timeline_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  ck_assert_ptr_null(pe_timeline_write(tl, path));
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  static char buf[1 << 20];
  size_t len = fread(buf, 1, sizeof buf - 1, f);
  buf[len] = 0;
  fclose(f);
  unlink(path);
  ck_assert_msg(json_valid(buf), "invalid JSON: %.200s", buf);
  ck_assert(strncmp(buf, "{\"traceEvents\":[", 16) == 0);
  ck_assert_int_eq(count_of(buf, "\"ph\":\"X\""), T * N);
  ck_assert_int_eq(count_of(buf, "\"name\":\"process_name\""), 2); /* cpu:0, cpu:1 */
  ck_assert_int_eq(count_of(buf, "\"name\":\"thread_name\""), T);
  ck_assert_ptr_nonnull(strstr(buf, "\"args\":{\"name\":\"cpu:1\"}"));
  ck_assert_ptr_nonnull(strstr(buf, "\"args\":{\"name\":\"worker 3\"}"));
  ck_assert_ptr_nonnull(strstr(buf, "\"name\":\"op2_99\""));
  /* Every span has the fields a trace viewer needs. */
  ck_assert_int_eq(count_of(buf, "\"dur\":"), T * N);
  ck_assert_int_eq(count_of(buf, "\"ts\":"), T * N);

  pe_timeline_reset(tl);
  ck_assert_uint_eq(pe_timeline_spans(tl), 0);
  pe_timeline_free(tl);
}
END_TEST

START_TEST(full_lanes_drop_and_names_are_escaped) {
  pe_timeline *tl;
  ck_assert_ptr_null(pe_timeline_new(2, 3, &tl));
  pe_tl_lane *a = pe_timeline_lane(tl, "lane \"a\"\\"), *b = pe_timeline_lane(tl, "b");
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert_ptr_null(pe_timeline_lane(tl, "c")); /* all lanes taken */
  pe_timeline_record(NULL, pe_cpu_place(), "ignored", 0, 1);
  for (int i = 0; i < 5; i++)
    pe_timeline_record(a, (pe_place){PE_PLACE_SIM, 3}, "we\"ird\\\n\tname", 10, 20);
  ck_assert_uint_eq(pe_timeline_spans(tl), 3);
  ck_assert_uint_eq(pe_timeline_dropped(tl), 2);
  char *json;
  size_t len;
  ck_assert_ptr_null(pe_timeline_json(tl, &json, &len));
  ck_assert_uint_eq(strlen(json), len);
  ck_assert_msg(json_valid(json), "%s", json);
  ck_assert_ptr_nonnull(strstr(json, "\"we\\\"ird\\\\\\u000a\\u0009name\""));
  ck_assert_ptr_nonnull(strstr(json, "\"args\":{\"name\":\"sim:3\"}"));
  ck_assert_ptr_nonnull(strstr(json, "\"dropped\":2"));
  free(json);
  pe_timeline_free(tl);
  pe_status *st = pe_timeline_new(0, 1, &tl);
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  ck_assert_ptr_null(tl);
  pe_status_free(st);
  pe_timeline_free(NULL);
}
END_TEST

/* --- spans from sim stream threads ----------------------------------------------------- */

typedef struct kernel_arg {
  pe_timeline *tl;
  pe_stream *s;
  int i;
} kernel_arg;

static pe_status *traced_kernel(void *arg) {
  kernel_arg *k = arg;
  uint64_t t0 = pe_timeline_now_ns();
  usleep(200);
  char name[16];
  snprintf(name, sizeof name, "k%d", k->i);
  pe_timeline_record(pe_timeline_thread_lane(k->tl, k->s->name), k->s->dev->place, name, t0,
                     pe_timeline_now_ns());
  return NULL;
}

START_TEST(sim_streams_record_lanes) {
  enum { D = 2, K = 10 };
  pe_timeline *tl;
  ck_assert_ptr_null(pe_timeline_new(16, 64, &tl));
  pe_device *d[D];
  kernel_arg args[D][2][K];
  for (int i = 0; i < D; i++)
    ck_assert_ptr_null(pe_device_open((pe_place){PE_PLACE_SIM, i}, NULL, &d[i]));
  for (int i = 0; i < D; i++)
    for (int s = 0; s < 2; s++)
      for (int k = 0; k < K; k++) {
        pe_stream *st = pe_device_stream(d[i], s ? PE_STREAM_COMM : PE_STREAM_COMPUTE);
        args[i][s][k] = (kernel_arg){tl, st, k};
        ck_assert_ptr_null(pe_stream_launch(st, traced_kernel, &args[i][s][k]));
      }
  for (int i = 0; i < D; i++)
    for (int s = 0; s < 2; s++)
      ck_assert_ptr_null(
          pe_stream_sync(pe_device_stream(d[i], s ? PE_STREAM_COMM : PE_STREAM_COMPUTE)));
  char *json;
  ck_assert_ptr_null(pe_timeline_json(tl, &json, NULL));
  ck_assert(json_valid(json));
  ck_assert_int_eq(count_of(json, "\"ph\":\"X\""), D * 2 * K);
  ck_assert_int_eq(count_of(json, "\"name\":\"thread_name\""), D * 2);
  ck_assert_ptr_nonnull(strstr(json, "{\"name\":\"sim:1/comm\"}"));
  ck_assert_ptr_nonnull(strstr(json, "{\"name\":\"sim:0\"}"));
  free(json);
  for (int i = 0; i < D; i++) pe_device_close(d[i]);
  pe_timeline_free(tl);
}
END_TEST

static Suite *timeline_suite(void) {
  Suite *s = suite_create("timeline");
#define ADD(fn)                    \
  do {                             \
    TCase *tc = tcase_create(#fn); \
    tcase_add_test(tc, fn);        \
    suite_add_tcase(s, tc);        \
  } while (0)
  ADD(json_checker_sanity);
  ADD(threads_record_and_json_parses);
  ADD(full_lanes_drop_and_names_are_escaped);
  ADD(sim_streams_record_lanes);
#undef ADD
  return s;
}

PE_CHECK_MAIN(timeline_suite)
