/* pe-executord end to end: what a request costs before a handler sees it.
 *   - A Run with 82 00 00 appended (field number 0 in a two-byte key, which
 *     protobuf-c skips and the main thread's peek cannot route) is answered
 *     as malformed and not run. It went to the work lane as client 0 and
 *     ran there, out of run_threads and its client's order.
 *   - A request of empty feeds is refused once its decode passes [limits]
 *     memory_per_request (protobuf-c grew the daemon by 64-70 bytes per
 *     byte: 32 MB of them got it OOM-killed), and so is a ProgramDesc of
 *     empty ops, counted on its wire bytes against max_program_ops before
 *     it is unpacked; an op of more than 1,024 attributes alike. The
 *     daemon answers a ping after each, and its peak resident memory
 *     (VmHWM) stays under a bound far below what the decodes took. */
#include "check_main.h"
#include "daemon_harness.h"

#define CLIENT 0xdec0

/* The daemon's peak resident memory in MiB (/proc/PID/status VmHWM). */
static long peak_mib(const dh_daemon *d) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)d->pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "VmHWM:", 6)) kb = strtol(line + 6, NULL, 10);
  fclose(f);
  ck_assert_int_ge(kb, 0);
  return kb / 1024;
}

/* The bound on the daemon's peak: its start, a model and the requests'
 * own bytes, with room for a sanitizer build; the decodes refused here
 * would each have taken over 500 MiB. */
#define PEAK_MIB 400

START_TEST(field0_run_is_refused) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 60000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "m", 1, false, NULL);
  Pe__Reply *before = dh_get_all(s, CLIENT, "m");
  dh_batch b;
  dh_batch_make(&b, 8, 1);
  Pe__RunRequest run;
  char *fetch[] = {mlp.loss};
  Pe__Request rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, fetch, 1, 1);
  size_t n = pe__request__get_packed_size(&rq);
  uint8_t *buf = malloc(n + 3);
  pe__request__pack(&rq, buf);
  memcpy(buf + n, (const uint8_t[]){0x82, 0x00, 0x00}, 3);
  Pe__Reply *rep = dh_call_raw(s, buf, n + 3);
  ck_assert_ptr_nonnull(rep);
  dh_err(rep, PE_EINVAL, "malformed request");
  ck_assert_msg(strstr(rep->message, "field number 0"), "%s", rep->message);
  pe__reply__free_unpacked(rep, NULL);
  /* Not run: the parameters are as they were. */
  Pe__Reply *after = dh_get_all(s, CLIENT, "m");
  const char *changed = dh_params_differ(before, after);
  ck_assert_msg(!changed, "'%s' changed: the refused run ran", changed);
  /* The same run without the 3 bytes runs. */
  rep = dh_call_raw(s, buf, n);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_ping(s));
  pe__reply__free_unpacked(before, NULL);
  pe__reply__free_unpacked(after, NULL);
  free(buf);
  dh_batch_free(&b);
  nn_close(s);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

START_TEST(empty_feeds_are_bounded) {
  dh_daemon d = {0};
  dh_start(&d, "[limits]\nmemory_per_request = 16M\n");
  int s = dh_connect(&d, 60000);
  /* 8M empty feeds: 16 MB on the wire, over 500 MB decoded. */
  enum { N = 8 << 20 };
  Pe__Tensor t = PE__TENSOR__INIT, **feeds = malloc(N * sizeof *feeds);
  for (int i = 0; i < N; i++) feeds[i] = &t;
  Pe__RunRequest run;
  Pe__Request rq = dh_run_req(CLIENT, &run, 1, feeds, N, NULL, 0, 1);
  Pe__Reply *rep = dh_call(s, &rq);
  dh_err(rep, PE_ENOMEM,
         "decoding it takes more than [limits] memory_per_request = 16777216 bytes");
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_ping(s));
  long peak = peak_mib(&d);
  ck_assert_msg(peak < PEAK_MIB, "daemon peak RSS %ld MiB", peak);
  free(feeds);
  nn_close(s);
  dh_cleanup(&d);
}
END_TEST

/* A Register of a ProgramDesc whose one block holds n_ops ops, each of
 * n_attrs attributes; the reply. */
static Pe__Reply *register_ops(int s, size_t n_ops, size_t n_attrs) {
  size_t len;
  uint8_t *prog = dh_program_of_attrs(NULL, n_ops, n_attrs, &len);
  Pe__RegisterRequest reg;
  Pe__Request rq = dh_register_req(CLIENT, &reg, prog, len, "big");
  Pe__Reply *rep = dh_call(s, &rq);
  free(prog);
  return rep;
}

START_TEST(program_counted_before_unpack) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 60000);
  /* 8M empty ops: 16 MB, over 500 MB unpacked. */
  Pe__Reply *rep = register_ops(s, 8 << 20, 0);
  dh_err(rep, PE_EINVAL,
         "ProgramDesc: 8388608 ops in its 1 block(s), over the limit [limits] max_program_ops = "
         "100000");
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_ping(s));
  long peak = peak_mib(&d);
  ck_assert_msg(peak < PEAK_MIB, "daemon peak RSS %ld MiB", peak);
  rep = register_ops(s, 1, 2000);
  dh_err(rep, PE_EINVAL,
         "ProgramDesc: block 0: op #0: 2000 attributes, over the limit of 1024 "
         "per op");
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_ping(s));
  nn_close(s);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("request_decode");
  TCase *tc = tcase_create("decode");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, field0_run_is_refused);
  tcase_add_test(tc, empty_feeds_are_bounded);
  tcase_add_test(tc, program_counted_before_unpack);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
