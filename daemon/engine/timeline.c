/* Timeline recording and Chrome trace output (contract in timeline.h).
 *
 * Publication. A lane's owner writes span n into its buffer, then stores
 * n + 1 into lane->n with release; readers load lane->n with acquire and
 * read only spans below it, so they never see a half-written span. Lanes
 * are published the same way: a claimer fills the lane, then sets `ready`
 * with release. */
#define _GNU_SOURCE
#include "timeline.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SPAN_NAME 48
#define LANE_NAME 48

typedef struct span {
  uint64_t t0, t1;
  int pid;
  char name[SPAN_NAME];
} span;

struct pe_tl_lane {
  int tid;
  char name[LANE_NAME];
  span *spans; /* cap entries; written by the owner only */
  size_t cap;
  _Atomic size_t n;         /* spans published (owner: release store) */
  _Atomic uint64_t dropped; /* owner increments; readers sum */
  _Atomic bool ready;       /* lane published (claimer: release store) */
};

struct pe_timeline {
  uint64_t id; /* unique per timeline: thread-local caches key on it */
  uint64_t t0; /* creation time; ts are relative to it */
  int max_lanes;
  size_t cap;
  _Atomic int claimed; /* lanes handed out (may exceed max_lanes) */
  pe_tl_lane *lanes;
};

static _Atomic uint64_t next_id = 1;

uint64_t pe_timeline_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

pe_status *pe_timeline_new(int max_lanes, size_t spans_per_lane, pe_timeline **out) {
  *out = NULL;
  if (max_lanes < 1 || max_lanes > 4096 || spans_per_lane < 1)
    return pe_error(PE_EINVAL, "timeline: %d lanes of %zu spans: need 1..4096 lanes, >= 1 span",
                    max_lanes, spans_per_lane);
  pe_timeline *tl = calloc(1, sizeof(*tl));
  pe_tl_lane *lanes = calloc((size_t)max_lanes, sizeof(*lanes));
  if (!tl || !lanes) {
    free(tl);
    free(lanes);
    return pe_error(PE_ENOMEM, "timeline: out of memory");
  }
  /* relaxed: only uniqueness matters. */
  tl->id = atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed);
  tl->t0 = pe_timeline_now_ns();
  tl->max_lanes = max_lanes;
  tl->cap = spans_per_lane;
  tl->lanes = lanes;
  atomic_init(&tl->claimed, 0);
  for (int i = 0; i < max_lanes; i++) {
    atomic_init(&lanes[i].n, 0);
    atomic_init(&lanes[i].dropped, 0);
    atomic_init(&lanes[i].ready, false);
  }
  *out = tl;
  return NULL;
}

void pe_timeline_free(pe_timeline *tl) {
  if (!tl) return;
  for (int i = 0; i < tl->max_lanes; i++) free(tl->lanes[i].spans);
  free(tl->lanes);
  free(tl);
}

pe_tl_lane *pe_timeline_lane(pe_timeline *tl, const char *name) {
  /* relaxed: the index is all that is claimed; the lane's contents are
   * published by `ready` below. */
  int i = atomic_fetch_add_explicit(&tl->claimed, 1, memory_order_relaxed);
  if (i >= tl->max_lanes) return NULL;
  pe_tl_lane *l = &tl->lanes[i];
  l->spans = malloc(tl->cap * sizeof(span));
  if (!l->spans) return NULL; /* stays unpublished */
  l->cap = tl->cap;
  l->tid = i;
  snprintf(l->name, sizeof l->name, "%s", name ? name : "lane");
  atomic_store_explicit(&l->ready, true, memory_order_release);
  return l;
}

/* A few (timeline, lane) pairs per thread: a thread usually records into
 * one timeline at a time. On overflow the oldest entry is replaced (the
 * thread then claims a new lane if it returns to that timeline). */
#define TLS_ENTRIES 4
static _Thread_local struct {
  uint64_t id;
  pe_tl_lane *lane;
} tls_lanes[TLS_ENTRIES];
static _Thread_local unsigned tls_next;

pe_tl_lane *pe_timeline_thread_lane(pe_timeline *tl, const char *name) {
  for (int i = 0; i < TLS_ENTRIES; i++)
    if (tls_lanes[i].id == tl->id) return tls_lanes[i].lane;
  pe_tl_lane *l = pe_timeline_lane(tl, name);
  unsigned k = tls_next++ % TLS_ENTRIES;
  tls_lanes[k].id = tl->id;
  tls_lanes[k].lane = l;
  return l;
}

static int place_pid(pe_place p) {
  return (int)p.kind * PE_MAX_PLACES + p.id;
}

void pe_timeline_record(pe_tl_lane *l, pe_place place, const char *name, uint64_t start_ns,
                        uint64_t end_ns) {
  if (!l) return;
  /* relaxed: only this thread writes n. */
  size_t n = atomic_load_explicit(&l->n, memory_order_relaxed);
  if (n >= l->cap) {
    atomic_fetch_add_explicit(&l->dropped, 1, memory_order_relaxed);
    return;
  }
  span *s = &l->spans[n];
  s->t0 = start_ns;
  s->t1 = end_ns < start_ns ? start_ns : end_ns;
  s->pid = place_pid(place);
  snprintf(s->name, sizeof s->name, "%s", name ? name : "?");
  /* release: the span's fields happen-before a reader's acquire of n. */
  atomic_store_explicit(&l->n, n + 1, memory_order_release);
}

uint64_t pe_timeline_spans(pe_timeline *tl) {
  uint64_t total = 0;
  for (int i = 0; i < tl->max_lanes; i++)
    if (atomic_load_explicit(&tl->lanes[i].ready, memory_order_acquire))
      total += atomic_load_explicit(&tl->lanes[i].n, memory_order_acquire);
  return total;
}

uint64_t pe_timeline_dropped(pe_timeline *tl) {
  uint64_t total = 0;
  for (int i = 0; i < tl->max_lanes; i++)
    total += atomic_load_explicit(&tl->lanes[i].dropped, memory_order_relaxed);
  return total;
}

void pe_timeline_reset(pe_timeline *tl) {
  for (int i = 0; i < tl->max_lanes; i++) {
    atomic_store_explicit(&tl->lanes[i].n, 0, memory_order_relaxed);
    atomic_store_explicit(&tl->lanes[i].dropped, 0, memory_order_relaxed);
  }
  tl->t0 = pe_timeline_now_ns();
}

/* --- JSON output --------------------------------------------------------- */

typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_reserve(sbuf *b, size_t more) {
  if (b->oom || b->len + more + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + more + 1) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = true;
    return;
  }
  b->p = p;
  b->cap = cap;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char tmp[256];
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof tmp) n = sizeof tmp - 1; /* our formats are short */
  sb_reserve(b, (size_t)n);
  if (b->oom) return;
  memcpy(b->p + b->len, tmp, (size_t)n);
  b->len += (size_t)n;
  b->p[b->len] = 0;
}

/* A JSON string literal of s (quotes, backslashes and controls escaped). */
static void sb_str(sbuf *b, const char *s) {
  sb_printf(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      sb_printf(b, "\\%c", c);
    else if (c < 0x20)
      sb_printf(b, "\\u%04x", c);
    else
      sb_printf(b, "%c", c);
  }
  sb_printf(b, "\"");
}

static void place_name(int pid, char *buf, size_t len) {
  static const char *kinds[] = {"cpu", "sim", "cuda"};
  int k = pid / PE_MAX_PLACES;
  snprintf(buf, len, "%s:%d", k < 3 ? kinds[k] : "?", pid % PE_MAX_PLACES);
}

#define MAX_PIDS (3 * PE_MAX_PLACES)

pe_status *pe_timeline_json(pe_timeline *tl, char **out, size_t *len) {
  *out = NULL;
  sbuf b = {0};
  sb_printf(&b, "{\"traceEvents\":[");
  bool first = true, pid_seen[MAX_PIDS] = {false};
  for (int i = 0; i < tl->max_lanes; i++) {
    pe_tl_lane *l = &tl->lanes[i];
    if (!atomic_load_explicit(&l->ready, memory_order_acquire)) continue;
    size_t n = atomic_load_explicit(&l->n, memory_order_acquire);
    bool lane_pid[MAX_PIDS] = {false};
    for (size_t k = 0; k < n; k++) {
      const span *s = &l->spans[k];
      int pid = s->pid >= 0 && s->pid < MAX_PIDS ? s->pid : 0;
      char pn[32];
      if (!pid_seen[pid]) {
        pid_seen[pid] = true;
        place_name(pid, pn, sizeof pn);
        sb_printf(&b, "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":",
                  first ? "" : ",", pid);
        sb_str(&b, pn);
        sb_printf(&b, "}}");
        first = false;
      }
      if (!lane_pid[pid]) {
        lane_pid[pid] = true;
        sb_printf(&b,
                  ",{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{"
                  "\"name\":",
                  pid, l->tid);
        sb_str(&b, l->name);
        sb_printf(&b, "}}");
      }
      /* ts/dur in microseconds with ns precision. */
      uint64_t ts = s->t0 > tl->t0 ? s->t0 - tl->t0 : 0, dur = s->t1 - s->t0;
      sb_printf(&b, ",{\"name\":");
      sb_str(&b, s->name);
      sb_printf(&b,
                ",\"cat\":\"op\",\"ph\":\"X\",\"ts\":%llu.%03llu,\"dur\":%llu.%03llu,\"pid\":%d,"
                "\"tid\":%d}",
                (unsigned long long)(ts / 1000), (unsigned long long)(ts % 1000),
                (unsigned long long)(dur / 1000), (unsigned long long)(dur % 1000), pid, l->tid);
    }
  }
  sb_printf(&b, "],\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped\":%llu}}\n",
            (unsigned long long)pe_timeline_dropped(tl));
  if (b.oom) {
    free(b.p);
    return pe_error(PE_ENOMEM, "timeline: out of memory writing JSON");
  }
  *out = b.p;
  if (len) *len = b.len;
  return NULL;
}

pe_status *pe_timeline_write(pe_timeline *tl, const char *path) {
  char *json;
  size_t len;
  PE_TRY(pe_timeline_json(tl, &json, &len));
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 16);
  if (!tmp) {
    free(json);
    return pe_error(PE_ENOMEM, "timeline: out of memory");
  }
  snprintf(tmp, plen + 16, "%s.tmp", path);
  pe_status *st = NULL;
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    st = pe_error(PE_EIO, "timeline: cannot create %s", tmp);
  } else {
    bool ok = fwrite(json, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok)
      st = pe_error(PE_EIO, "timeline: cannot write %s", tmp);
    else if (rename(tmp, path) != 0)
      st = pe_error(PE_EIO, "timeline: cannot rename %s to %s", tmp, path);
    if (st) unlink(tmp);
  }
  free(tmp);
  free(json);
  return st;
}
