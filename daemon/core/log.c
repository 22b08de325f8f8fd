#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int level = -1;
/* -1: not looked at yet; 0: a terminal or file; 1: the journal. Set once,
 * on the first line (stderr does not change under a running daemon); a race
 * of two first lines computes the same value twice. */
static int journal = -1;

static pe_log_level env_level(void) {
  const char *e = getenv("PE_LOG");
  if (!e) return PE_LOG_INFO;
  if (!strcmp(e, "error")) return PE_LOG_ERROR;
  if (!strcmp(e, "warn")) return PE_LOG_WARN;
  if (!strcmp(e, "debug")) return PE_LOG_DEBUG;
  return PE_LOG_INFO;
}

void pe_log_set_level(pe_log_level lvl) {
  level = (int)lvl;
}
pe_log_level pe_log_get_level(void) {
  if (level < 0) level = (int)env_level();
  return (pe_log_level)level;
}

/* systemd sets JOURNAL_STREAM="<dev>:<ino>" for a service whose stdout or
 * stderr is connected to the journal; stderr is the journal when it is
 * that very file (an inherited variable with stderr redirected elsewhere
 * is not). */
static bool stderr_is_journal(void) {
  const char *e = getenv("JOURNAL_STREAM");
  unsigned long long dev, ino;
  char tail;
  if (!e || sscanf(e, "%llu:%llu%c", &dev, &ino, &tail) != 2) return false;
  struct stat st;
  return fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
         (unsigned long long)st.st_ino == ino;
}

static bool to_journal(void) {
  int j = __atomic_load_n(&journal, __ATOMIC_RELAXED);
  if (j < 0) {
    j = stderr_is_journal();
    __atomic_store_n(&journal, j, __ATOMIC_RELAXED);
  }
  return j;
}

/* One event, one line: a control character (a newline from a caller's
 * string) would start a line that the journal files at the default level,
 * or forge a "<N>" prefix. */
static void one_line(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 && *s != '\t') *s = '?';
}

void pe_log(pe_log_level lvl, const char *fmt, ...) {
  if ((int)lvl > (int)pe_log_get_level()) return;
  /* The journal reads "<N>" (sd-daemon.h: 3 err, 4 warning, 6 info, 7
   * debug) as the line's priority and stamps the time itself. */
  static const char *names[] = {"error", "warn", "info", "debug"};
  static const char *prio[] = {"<3>", "<4>", "<6>", "<7>"};
  char head[64];
  if (to_journal()) {
    snprintf(head, sizeof head, "%s", prio[lvl]);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(head, sizeof head, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
             names[lvl]);
  }
  /* Most lines fit the stack buffer; a longer one is formatted again into
   * a heap buffer of its size, up to PE_LOG_MAX_LINE, and cut there with a
   * mark saying how much is missing. */
  char stack[2048];
  char *msg = stack;
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(stack, sizeof stack, fmt, ap);
  va_end(ap);
  if (n < 0) { /* an encoding error: log the level at least */
    n = 0;
    stack[0] = 0;
  }
  size_t cut = 0;
  if ((size_t)n >= sizeof stack) {
    size_t want = (size_t)n < PE_LOG_MAX_LINE ? (size_t)n : PE_LOG_MAX_LINE;
    char *big = malloc(want + 1);
    if (big) {
      vsnprintf(big, want + 1, fmt, ap2);
      msg = big;
      cut = (size_t)n - want;
    } else {
      cut = (size_t)n - (sizeof stack - 1);
    }
  }
  va_end(ap2);
  one_line(msg);
  /* One fprintf per line: it holds stderr's lock for the call, so threads
   * do not interleave within a line. */
  if (cut)
    fprintf(stderr, "%s%s... [%zu more bytes cut]\n", head, msg, cut);
  else
    fprintf(stderr, "%s%s\n", head, msg);
  if (msg != stack) free(msg);
}
