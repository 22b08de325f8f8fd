/* Region names that carry their creator (common/shm_owner.h): the name
 * round-trips, other names are not taken for ours, and a creator is gone
 * once it exited or when its pid now belongs to a process that started at
 * another time (pid reuse). */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "shm_owner.h"

/* "/pe-<pid>-<start>-<16 hex digits>", and nothing more: the names are
 * listed in /dev/shm for everyone, so they must not hold the client id (a
 * credential). Two names differ. */
START_TEST(test_name_round_trip) {
  char name[64], other[64];
  ck_assert_int_eq(pe_shm_owner_name(name, sizeof name), 0);
  ck_assert_int_eq(pe_shm_owner_name(other, sizeof other), 0);
  ck_assert_str_ne(name, other);
  long pid;
  uint64_t start;
  ck_assert(pe_shm_owner_parse(name, &pid, &start));
  ck_assert_int_eq(pid, (long)getpid());
  ck_assert(start != 0); /* /proc is there */
  char want[64];
  int n = snprintf(want, sizeof want, "/pe-%ld-%" PRIx64 "-", pid, start);
  ck_assert_msg(!strncmp(name, want, (size_t)n), "%s does not start with %s", name, want);
  ck_assert_msg(strlen(name) == (size_t)n + 16 && strspn(name + n, "0123456789abcdef") == 16,
                "%s: not 16 hex digits after %s", name, want);
  ck_assert(pe_shm_owner_parse(name + 1, &pid, &start)); /* as /dev/shm lists it */
  ck_assert(!pe_shm_owner_gone(pid, start));             /* this process */
  /* Too small a buffer. */
  ck_assert_int_eq(pe_shm_owner_name(name, 12), -1);
}
END_TEST

START_TEST(test_other_names) {
  long pid;
  uint64_t start;
  const char *bad[] = {
      "/pe-00c0ffee12345678-1", /* the names before pids were in them */
      "/pe-123-abc-00c0ffee123456789",
      "/pe-123-abc-00c0ffee12345678-",
      "/pe-0-abc-00c0ffee12345678-1",
      "/pe--abc-00c0ffee12345678-1",
      "/pe-123-ABC-00c0ffee12345678-1",
      "/pe-123-abc-00c0ffee12345678-1x",
      "/xy-123-abc-00c0ffee12345678-1",
      "/pe-99999999999-abc-00c0ffee12345678-1",
      "/sem.pe-123-abc-00c0ffee12345678-1",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(!pe_shm_owner_parse(bad[i], &pid, &start), "%s parsed", bad[i]);
  /* The name now, and the older one with a client id and a counter: the
   * sweeps remove regions an older libpeclient left. */
  ck_assert(pe_shm_owner_parse("/pe-123-abc-00c0ffee12345678", &pid, &start));
  ck_assert_int_eq(pid, 123);
  ck_assert_uint_eq(start, 0xabc);
  ck_assert(pe_shm_owner_parse("/pe-124-abd-00c0ffee12345678-1", &pid, &start));
  ck_assert_int_eq(pid, 124);
  ck_assert_uint_eq(start, 0xabd);
}
END_TEST

/* A child that made a name: alive it is not gone; the same pid with
 * another start time is (a reused pid); dead and reaped it is. */
START_TEST(test_creator_gone) {
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    char name[64];
    pe_shm_owner_name(name, sizeof name);
    ssize_t w = write(fds[1], name, sizeof name);
    (void)w;
    pause();
    _exit(0);
  }
  char name[64];
  ck_assert_int_eq(read(fds[0], name, sizeof name), (ssize_t)sizeof name);
  long pid;
  uint64_t start;
  ck_assert(pe_shm_owner_parse(name, &pid, &start));
  ck_assert_int_eq(pid, (long)child);
  ck_assert(!pe_shm_owner_gone(pid, start));
  ck_assert(pe_shm_owner_gone(pid, start + 1));
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  ck_assert(pe_shm_owner_gone(pid, start));
  close(fds[0]);
  close(fds[1]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("shm_owner");
  TCase *tc = tcase_create("names");
  tcase_add_test(tc, test_name_round_trip);
  tcase_add_test(tc, test_other_names);
  tcase_add_test(tc, test_creator_gone);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
