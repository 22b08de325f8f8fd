/* pe-executord end to end: the memory of a large register is given back.
 * A register of a program of tens of thousands of ops allocates hundreds
 * of MB of compile temporaries on the request thread that handles it
 * (glibc gives each thread an arena of its own), and the deregister frees
 * the program; without a trim that memory stays resident, and each cycle
 * on another request thread adds its own (about 200 MB per cycle at 100k
 * ops). Register+deregister cycles must leave the daemon's resident size
 * (VmRSS) near where the first cycle left it.
 *
 * Under a sanitizer (PE_SANITIZED=1) the allocator is the sanitizer's and
 * malloc_trim does nothing: the cycles still run (the register and the
 * deregister must work), the RSS bound is not asserted. */
#include "check_main.h"
#include "daemon_harness.h"
#include "pe_builder.h"

#define CLIENT 0x55a1

/* A chain of n relu ops on a [-1, 8] feed, then a mean: n + 1 ops. */
static void chain_program(int n, uint8_t **bytes, size_t *len) {
  pe_builder *b = pe_builder_new();
  ck_assert_ptr_nonnull(b);
  int64_t dims[] = {-1, 8};
  const char *x = pe_builder_data(b, "x", PE_B_F32, 2, dims);
  for (int i = 0; i < n && x; i++) x = pe_builder_relu(b, x);
  ck_assert_msg(x && pe_builder_mean(b, x), "%s", pe_builder_error(b));
  ck_assert_msg(pe_builder_finish(b, bytes, len) == 0, "%s", pe_builder_error(b));
  pe_builder_free(b);
}

static uint64_t register_chain(int s, const uint8_t *bytes, size_t len) {
  Pe__Reply *rep = dh_register_eval_call(s, CLIENT, bytes, len, "chain");
  dh_ok(rep);
  uint64_t h = rep->register_->handle;
  pe__reply__free_unpacked(rep, NULL);
  return h;
}

START_TEST(test_register_cycles_give_memory_back) {
  enum { OPS = 30000, CYCLES = 6 };
  bool sanitized = getenv("PE_SANITIZED") != NULL;
  uint8_t *bytes;
  size_t len;
  chain_program(OPS, &bytes, &len);
  dh_daemon d = {0};
  /* Eight work threads (the default): the cycles land on several. */
  dh_start(&d, "[limits]\nmax_program_ops = 100000\n");
  int s = dh_connect(&d, 300000);
  long after[CYCLES];
  for (int i = 0; i < CYCLES; i++) {
    dh_deregister(s, CLIENT, register_chain(s, bytes, len));
    after[i] = dh_rss_kb(&d);
    fprintf(stderr, "cycle %d: VmRSS %ld kB\n", i, after[i]);
  }
  ck_assert(dh_ping(s));
  nn_close(s);
  free(bytes);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
  if (sanitized) return;
  /* 64 MB of slack: the first cycle's arena, fragmentation, the reply
   * cache; without the trim, six cycles of 30k ops grow by hundreds. */
  for (int i = 1; i < CYCLES; i++)
    ck_assert_msg(after[i] <= after[0] + 64 * 1024,
                  "VmRSS %ld kB after cycle %d, %ld kB after the first: the cycles' memory "
                  "was not given back",
                  after[i], i, after[0]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("rss_release");
  TCase *tc = tcase_create("e2e");
  tcase_set_timeout(tc, 500);
  tcase_add_test(tc, test_register_cycles_give_memory_back);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
