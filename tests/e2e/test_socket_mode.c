/* pe-executord end to end: the ipc socket file is never more open than
 * [server] socket_mode, from the moment it exists. The daemon starts under
 * umask 000 (its socket would be created 0777) while a thread watches the
 * path with a tight stat loop from before the daemon starts: every mode it
 * sees must be within socket_mode. Several starts, so that a window between
 * the file's creation and a later chmod is seen (a connection made in it
 * stays open). */
#include <pthread.h>

#include "check_main.h"
#include "daemon_harness.h"

typedef struct watch {
  char path[400];
  atomic_bool stop;
  mode_t seen_union; /* permission bits of every mode seen, or'ed */
  atomic_long seen;  /* stats that found the file */
} watch;

static void *watch_main(void *arg) {
  watch *w = arg;
  while (!atomic_load(&w->stop)) {
    struct stat sb;
    if (stat(w->path, &sb) != 0) continue;
    w->seen_union |= sb.st_mode & 07777;
    atomic_fetch_add(&w->seen, 1);
  }
  return NULL;
}

START_TEST(test_socket_mode_from_creation) {
  enum { STARTS = 16 };
  umask(0);
  dh_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "/tmp/pe-e2e-XXXXXX");
  ck_assert_msg(mkdtemp(d.dir) != NULL, "mkdtemp: %s", strerror(errno));
  for (int i = 0; i < STARTS; i++) {
    watch w = {.seen_union = 0};
    snprintf(w.path, sizeof w.path, "%s/d.sock", d.dir);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, watch_main, &w), 0);
    dh_start(&d, "[server]\nsocket_mode = 0660\n");
    /* On a loaded machine the watcher may not have run yet. */
    for (double t0 = dh_now(); !atomic_load(&w.seen) && dh_now() - t0 < 30;) dh_sleep_ms(10);
    atomic_store(&w.stop, true);
    pthread_join(t, NULL);
    ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
    if (!w.seen || (w.seen_union & ~(mode_t)0660)) dh_cleanup(&d);
    ck_assert_msg(w.seen > 0, "start %d: the socket file was never seen", i);
    ck_assert_msg((w.seen_union & ~(mode_t)0660) == 0,
                  "start %d: socket file %s had mode bits %04o beyond socket_mode 0660", i, w.path,
                  (unsigned)w.seen_union);
    ck_assert_msg(access(w.path, F_OK) != 0, "start %d: socket file left after the stop", i);
  }
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("socket_mode");
  TCase *tc = tcase_create("e2e");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_socket_mode_from_creation);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
