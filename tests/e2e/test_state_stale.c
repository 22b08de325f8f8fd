/* pe-executord end to end: a start removes the temporaries
 * that interrupted checkpoint writes left (<name>.ckpt.tmp.<pid>.<n>),
 * logging each, and leaves every other file alone. */
#include "check_main.h"
#include "daemon_harness.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

/* Temporaries of interrupted writes go at start, logged; other files stay. */
START_TEST(test_stale_temporaries_removed_at_start) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  char dir[400], path[600];
  snprintf(dir, sizeof dir, "%s/models/pk", d.state);
  PE_CK_OK(pe_mkdir_p(dir, 0750));
  const char *stale[] = {"shutdown.ckpt.tmp.4433.0", "best.ckpt.tmp.12.7"};
  const char *kept[] = {"shutdown.ckpt", "notes.txt", "best.ckpt.tmp.12", "x.ckpt.tmp.1.2.bak"};
  const uint8_t data[] = "partial";
  for (int i = 0; i < 2; i++) PE_CK_OK(pe_write_atomic(dir, stale[i], data, sizeof data));
  for (int i = 0; i < 4; i++) PE_CK_OK(pe_write_atomic(dir, kept[i], data, sizeof data));

  dh_start(&d, NULL);
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, stale[i]);
    ck_assert_msg(access(path, F_OK) != 0, "%s is still there", path);
    ck_assert_msg(dh_log_has(&d, path), "the log does not name %s", path);
  }
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, kept[i]);
    ck_assert_msg(access(path, F_OK) == 0, "%s was removed", path);
  }
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("state_stale");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_stale_temporaries_removed_at_start);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
