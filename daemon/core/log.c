#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int level = -1;

static pe_log_level env_level(void) {
  const char *e = getenv("PE_LOG");
  if (!e) return PE_LOG_INFO;
  if (!strcmp(e, "error")) return PE_LOG_ERROR;
  if (!strcmp(e, "warn")) return PE_LOG_WARN;
  if (!strcmp(e, "debug")) return PE_LOG_DEBUG;
  return PE_LOG_INFO;
}

void pe_log_set_level(pe_log_level lvl) { level = (int)lvl; }
pe_log_level pe_log_get_level(void) {
  if (level < 0) level = (int)env_level();
  return (pe_log_level)level;
}

void pe_log(pe_log_level lvl, const char *fmt, ...) {
  if ((int)lvl > (int)pe_log_get_level()) return;
  static const char *names[] = {"error", "warn", "info", "debug"};
  char line[2048];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                   names[lvl]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s\n", line);
}
