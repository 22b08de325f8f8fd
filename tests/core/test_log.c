/* core/log: the journal format when $JOURNAL_STREAM names stderr (a "<N>"
 * priority and no timestamp), the plain format otherwise, long and
 * multi-line messages. Each test (its own process under CK_FORK) points
 * stderr at a file first; the log looks at stderr on its first line. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "core/log.h"

static char path[64];

/* stderr -> a fresh file; JOURNAL_STREAM -> its "dev:ino" plus ino_delta
 * (nonzero: a stream that is not stderr), or unset when ino_delta < 0. */
static void stderr_to_file(long ino_delta) {
  snprintf(path, sizeof path, "/tmp/pe-log-XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
  close(fd);
  struct stat st;
  ck_assert_int_eq(fstat(STDERR_FILENO, &st), 0);
  char js[64];
  snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino + (unsigned long long)ino_delta);
  if (ino_delta < 0)
    unsetenv("JOURNAL_STREAM");
  else
    setenv("JOURNAL_STREAM", js, 1);
  pe_log_set_level(PE_LOG_DEBUG);
}

/* What the log wrote (malloc'd); removes the file. */
static char *logged(void) {
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char *buf = calloc(1, 1 << 20);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = 0;
  fclose(f);
  unlink(path);
  return buf;
}

static void log_each_level(void) {
  PE_LOGE("e %d", 1);
  PE_LOGW("w %s", "two");
  PE_LOGI("i");
  PE_LOGD("d");
}

START_TEST(journal_gets_priority_prefix_and_no_time) {
  stderr_to_file(0);
  log_each_level();
  char *out = logged();
  ck_assert_str_eq(out, "<3>e 1\n<4>w two\n<6>i\n<7>d\n");
  free(out);
}
END_TEST

/* The level filter applies as before. */
START_TEST(journal_respects_level) {
  stderr_to_file(0);
  pe_log_set_level(PE_LOG_WARN);
  log_each_level();
  char *out = logged();
  ck_assert_str_eq(out, "<3>e 1\n<4>w two\n");
  free(out);
}
END_TEST

/* JOURNAL_STREAM inherited by a process whose stderr went elsewhere, or
 * none at all: the plain format with the time and the level's name. */
static void check_plain(const char *out) {
  const char *names[] = {"error e 1\n", "warn  w two\n", "info  i\n", "debug d\n"};
  const char *p = out;
  for (int i = 0; i < 4; i++) {
    /* 2026-11-25T19:12:50.816Z name ... */
    ck_assert_msg(strlen(p) > 25 && p[4] == '-' && p[10] == 'T' && p[23] == 'Z' && p[24] == ' ',
                  "line %d: %s", i, p);
    ck_assert_msg(!strncmp(p + 25, names[i], strlen(names[i])), "line %d: %s", i, p);
    p = strchr(p, '\n') + 1;
  }
  ck_assert_str_eq(p, "");
  ck_assert_ptr_null(strchr(out, '<'));
}

START_TEST(other_stream_is_plain) {
  stderr_to_file(1);
  log_each_level();
  char *out = logged();
  check_plain(out);
  free(out);
}
END_TEST

START_TEST(no_journal_is_plain) {
  stderr_to_file(-1);
  log_each_level();
  char *out = logged();
  check_plain(out);
  free(out);
}
END_TEST

START_TEST(garbled_journal_stream_is_plain) {
  stderr_to_file(-1);
  struct stat st;
  ck_assert_int_eq(fstat(STDERR_FILENO, &st), 0);
  char js[64];
  snprintf(js, sizeof js, "%llu:%llux", (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino);
  setenv("JOURNAL_STREAM", js, 1);
  log_each_level();
  char *out = logged();
  check_plain(out);
  free(out);
}
END_TEST

/* A message past the old 2048-byte buffer is kept whole; one past
 * PE_LOG_MAX_LINE is cut there with a mark naming what is missing. */
START_TEST(long_lines) {
  stderr_to_file(0);
  size_t n = 5000, big = PE_LOG_MAX_LINE + 1000;
  char *s = malloc(big + 1);
  memset(s, 'a', big);
  s[n - 1] = 'Z';
  s[n] = 0;
  PE_LOGW("%s", s);
  s[n - 1] = 'a';
  s[n] = 'a';
  s[big] = 0;
  PE_LOGE("%s", s);
  char *out = logged();
  char *nl = strchr(out, '\n');
  ck_assert_ptr_nonnull(nl);
  ck_assert_uint_eq((size_t)(nl - out), 3 + n); /* "<4>" + all of it */
  ck_assert_int_eq(nl[-1], 'Z');
  char *second = nl + 1;
  ck_assert(!strncmp(second, "<3>aaa", 6));
  char want[64];
  snprintf(want, sizeof want, "a... [%d more bytes cut]\n", 1000);
  ck_assert_msg(strlen(second) == 3 + PE_LOG_MAX_LINE + strlen(want) - 1 &&
                    !strcmp(second + strlen(second) - strlen(want), want),
                "cut line of %zu bytes ends: %s", strlen(second),
                second + (strlen(second) > 60 ? strlen(second) - 60 : 0));
  free(out);
  free(s);
}
END_TEST

/* A newline in a message (a client's string) does not start a line of its
 * own, which the journal would file at the default level. */
START_TEST(one_event_one_line) {
  stderr_to_file(0);
  PE_LOGE("bad name 'x\n<0>forged\r'");
  char *out = logged();
  ck_assert_str_eq(out, "<3>bad name 'x?<0>forged?'\n");
  free(out);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("log");
  TCase *tc = tcase_create("format");
  tcase_add_test(tc, journal_gets_priority_prefix_and_no_time);
  tcase_add_test(tc, journal_respects_level);
  tcase_add_test(tc, other_stream_is_plain);
  tcase_add_test(tc, no_journal_is_plain);
  tcase_add_test(tc, garbled_journal_stream_is_plain);
  tcase_add_test(tc, long_lines);
  tcase_add_test(tc, one_event_one_line);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
