/* places = auto's remembered choices (server/places_recall.h). */
#include "server/places_recall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "format/durable_file.h"
#include "ops/device_ctx.h"

#define MAGIC "pe-places-choice 1"
#define MAX_FILE (64 << 10)

void pe_places_machine(char *buf, size_t cap) {
  char model[128] = "unknown cpu";
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10)) continue;
    const char *v = strchr(line, ':');
    if (!v) break;
    for (v++; *v == ' '; v++) {
    }
    snprintf(model, sizeof model, "%.*s", (int)strcspn(v, "\n"), v);
    break;
  }
  if (f) fclose(f);
  const char *isa = "x86-64";
#if defined(__x86_64__)
  __builtin_cpu_init();
  isa = __builtin_cpu_supports("avx512f") ? "avx512"
        : __builtin_cpu_supports("avx2")  ? "avx2"
        : __builtin_cpu_supports("avx")   ? "avx"
                                          : "sse";
#else
  isa = "other";
#endif
  snprintf(buf, cap, "%s|%d cores|%s", model, pe_cpu_cores(), isa);
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const uint8_t *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

pe_status *pe_places_key(const Pe__RegisterRequest *rq, int64_t batch, const char *machine,
                         char *buf, size_t cap) {
  uint64_t h = fnv1a(0xcbf29ce484222325ull, rq->program.data, rq->program.len);
  if (rq->options) {
    /* What shapes the compile only: not where, how seeded or kept. */
    Pe__RegisterOptions o = *rq->options;
    o.places = (char *)"";
    o.seed = 0;
    o.persistent = false;
    o.batch_hint = 0;
    o.for_test = false;
    size_t n = pe__register_options__get_packed_size(&o);
    uint8_t *b = malloc(n ? n : 1);
    if (!b) return pe_error(PE_ENOMEM, "places trial: out of memory hashing the options");
    pe__register_options__pack(&o, b);
    h = fnv1a(h, b, n);
    free(b);
  }
  h = fnv1a(h, &batch, sizeof batch);
  h = fnv1a(h, machine, strlen(machine));
  snprintf(buf, cap, "%016llx.choice", (unsigned long long)h);
  return NULL;
}

/* Parse text into *t; NULL, or what is wrong (static text). */
static const char *parse(char *text, const char *machine, int64_t batch, pe_places_trial *t) {
  char *save = NULL;
  char *line = strtok_r(text, "\n", &save);
  if (!line || strcmp(line, MAGIC)) return "no '" MAGIC "' header";
  line = strtok_r(NULL, "\n", &save);
  if (!line || strncmp(line, "machine ", 8)) return "no machine line";
  if (strcmp(line + 8, machine)) return "written on another machine";
  long long b = 0;
  line = strtok_r(NULL, "\n", &save);
  if (!line || sscanf(line, "batch %lld", &b) != 1 || b < 1 || (batch > 0 && b != batch))
    return "another batch";
  int chosen = -1;
  line = strtok_r(NULL, "\n", &save);
  if (!line || sscanf(line, "chosen %d", &chosen) != 1) return "no chosen line";
  memset(t->cand, 0, sizeof t->cand);
  t->n_cand = 0;
  while ((line = strtok_r(NULL, "\n", &save))) {
    int places, strategy, fused, auto_s;
    double ms;
    int used = 0;
    if (t->n_cand >= PE_PLACES_MAX_CANDIDATES) return "too many candidates";
    if (sscanf(line, "candidate %d %d %d %d %lf%n", &places, &strategy, &fused, &auto_s, &ms,
               &used) != 5 ||
        line[used] != 0)
      return "a malformed candidate line";
    if (places < 1 || places > pe_cpu_cores() || places > PE_MAX_PLACES)
      return "a candidate's places out of range";
    if (strategy < PE_STRATEGY_ALLREDUCE || strategy > PE_STRATEGY_SHARDED || (fused & ~1) ||
        (auto_s & ~1) || !(ms >= 0 && ms < 1e9))
      return "a candidate's strategy, flags or time out of range";
    t->cand[t->n_cand++] = (pe_places_candidate){.n_places = places,
                                                 .strategy = (pe_graph_strategy)strategy,
                                                 .fused = fused,
                                                 .auto_strategy = auto_s,
                                                 .step_ms = ms};
  }
  if (chosen < 0 || chosen >= t->n_cand || t->cand[chosen].step_ms <= 0)
    return "the chosen candidate is not one measured";
  t->chosen = chosen;
  t->batch = b;
  t->remembered = true;
  t->trial_s = 0;
  return NULL;
}

/* Read the choice at path (see pe_places_recall; batch 0: any). */
static bool recall_path(const char *path, const char *machine, int64_t batch, pe_places_trial *t) {
  uint8_t *buf = NULL;
  size_t len = 0;
  pe_status *st = pe_read_file(path, MAX_FILE, &buf, &len);
  if (st) {
    if (pe_status_code(st) != PE_ENOTFOUND)
      PE_LOGW("places trial: ignoring %s: %s", path, pe_status_msg(st));
    pe_status_free(st);
    return false;
  }
  char *text = malloc(len + 1);
  const char *why = text ? NULL : "out of memory";
  if (text) {
    memcpy(text, buf, len);
    text[len] = 0;
    if (strlen(text) != len) why = "a NUL byte in the text";
  }
  pe_places_trial got = {0};
  if (!why) why = parse(text, machine, batch, &got);
  free(text);
  free(buf);
  if (why) {
    PE_LOGW("places trial: ignoring the remembered choice %s: %s; the trial runs again", path, why);
    return false;
  }
  *t = got;
  return true;
}

bool pe_places_recall(const char *state_dir, const char *file, const char *machine, int64_t batch,
                      pe_places_trial *t) {
  char path[4096];
  snprintf(path, sizeof path, "%s/places/%s", state_dir, file);
  return recall_path(path, machine, batch, t);
}

/* Write t as dir/file (atomically), dir made when missing. */
static pe_status *remember_at(const char *dir, const char *file, const char *machine,
                              const pe_places_trial *t) {
  PE_TRY(pe_mkdir_p(dir, 0750));
  size_t cap = 256 + strlen(machine) + (size_t)t->n_cand * 96;
  char *text = malloc(cap);
  if (!text) return pe_error(PE_ENOMEM, "places trial: out of memory");
  int n = snprintf(text, cap, MAGIC "\nmachine %s\nbatch %lld\nchosen %d\n", machine,
                   (long long)t->batch, t->chosen);
  for (int i = 0; i < t->n_cand; i++) {
    const pe_places_candidate *c = &t->cand[i];
    n += snprintf(text + n, cap - (size_t)n, "candidate %d %d %d %d %.6f\n", c->n_places,
                  (int)c->strategy, c->fused ? 1 : 0, c->auto_strategy ? 1 : 0,
                  c->step_ms > 0 ? c->step_ms : 0);
  }
  pe_status *st = pe_write_atomic(dir, file, (const uint8_t *)text, (size_t)n);
  free(text);
  return st;
}

pe_status *pe_places_remember(const char *state_dir, const char *file, const char *machine,
                              const pe_places_trial *t) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/places", state_dir);
  return remember_at(dir, file, machine, t);
}

/* <state_dir>/models/<model> into dir; false when it does not fit. */
static bool model_dir(const char *state_dir, const char *model, char *dir, size_t cap) {
  int n = snprintf(dir, cap, "%s/models/%s", state_dir, model);
  return n > 0 && (size_t)n < cap;
}

bool pe_places_recall_model(const char *state_dir, const char *model, const char *machine,
                            pe_places_trial *t) {
  char dir[4096], path[4200];
  if (!model_dir(state_dir, model, dir, sizeof dir)) return false;
  snprintf(path, sizeof path, "%s/" PE_PLACES_MODEL_FILE, dir);
  return recall_path(path, machine, 0, t);
}

pe_status *pe_places_remember_model(const char *state_dir, const char *model, const char *machine,
                                    const pe_places_trial *t) {
  char dir[4096];
  if (!model_dir(state_dir, model, dir, sizeof dir))
    return pe_error(PE_EINVAL, "places of model '%s': path too long under %s", model, state_dir);
  return remember_at(dir, PE_PLACES_MODEL_FILE, machine, t);
}
