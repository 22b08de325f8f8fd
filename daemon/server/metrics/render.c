/* Prometheus text exposition of the daemon's state (see metrics/render.h). */
#include "server/metrics/render.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "server/dispatch.h"

/* "# HELP" and "# TYPE" of one family. */
static void family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: backslash, double quote and newline escaped. */
static void label_value(FILE *f, const char *v) {
  for (; *v; v++) {
    if (*v == '\\')
      fputs("\\\\", f);
    else if (*v == '"')
      fputs("\\\"", f);
    else if (*v == '\n')
      fputs("\\n", f);
    else
      fputc(*v, f);
  }
}

/* The shortest of %.15g and %.17g that reads back as v. */
typedef struct number_text {
  char s[32];
} number_text;
static number_text number(double v) {
  number_text t;
  snprintf(t.s, sizeof t.s, "%.15g", v);
  if (strtod(t.s, NULL) != v) snprintf(t.s, sizeof t.s, "%.17g", v);
  return t;
}

/* One sample: name, up to two labels (a NULL key ends them) and its value.
 * Values are doubles: counts stay exact up to 2^53. */
static void sample(FILE *f, const char *name, const char *k1, const char *v1, const char *k2,
                   const char *v2, double v) {
  fputs(name, f);
  if (k1) {
    fprintf(f, "{%s=\"", k1);
    label_value(f, v1);
    if (k2) {
      fprintf(f, "\",%s=\"", k2);
      label_value(f, v2);
    }
    fputs("\"}", f);
  }
  fprintf(f, " %s\n", number(v).s);
}

/* A family of one unlabelled sample. */
static void single(FILE *f, const char *name, const char *type, const char *help, double v) {
  family(f, name, type, help);
  sample(f, name, NULL, NULL, NULL, NULL, v);
}

/* A counter as a sample's value. */
static double get(const atomic_uint_fast64_t *c) {
  return (double)pe_metrics_get(c);
}

static const char *kind_name(int k) {
  return k == PE_METRICS_KIND_UNDECODED ? "undecodable" : pe_request_kind_name(k);
}

static void requests(FILE *f, const pe_metrics_view *v) {
  const Pe__StatusReply *r = v->status;
  single(f, "pe_requests_received_total", "counter", "Requests taken off the socket.",
         (double)r->requests_total);
  single(f, "pe_requests_failed_total", "counter",
         "Requests answered with an error (the status request's requests_failed).",
         (double)r->requests_failed);
  family(f, "pe_requests_total", "counter",
         "Requests answered, by request kind and reply code (resends answered from the reply "
         "cache not counted).");
  for (int k = 0; k < PE_METRICS_KINDS; k++)
    for (int c = 0; c < PE_ECODE_COUNT; c++)
      if (get(&v->counters->requests[k][c]))
        sample(f, "pe_requests_total", "kind", kind_name(k), "code", pe_code_name((pe_code)c),
               get(&v->counters->requests[k][c]));
  single(f, "pe_queue_depth", "gauge", "Requests waiting or being handled.",
         (double)r->queue_depth);
  static const struct {
    const char *name, *help;
    size_t off;
  } lane_fields[] = {
      {"pe_lane_threads", "Request threads of the lane.", offsetof(Pe__LaneStatus, threads)},
      {"pe_lane_busy", "Requests the lane's threads are handling.", offsetof(Pe__LaneStatus, busy)},
      {"pe_lane_queued", "Requests waiting in the lane's queue.", offsetof(Pe__LaneStatus, queued)},
  };
  for (size_t i = 0; i < sizeof lane_fields / sizeof lane_fields[0]; i++) {
    family(f, lane_fields[i].name, "gauge", lane_fields[i].help);
    for (size_t l = 0; l < r->n_lanes; l++) {
      const int32_t *x = (const int32_t *)((const char *)r->lanes[l] + lane_fields[i].off);
      sample(f, lane_fields[i].name, "lane", r->lanes[l]->name, NULL, NULL, *x);
    }
  }
}

/* The histogram's buckets are cumulative; +Inf is the count. */
static void runs(FILE *f, const pe_metrics_view *v) {
  const Pe__StatusReply *r = v->status;
  const pe_metrics_counters *c = v->counters;
  const char *h = "pe_run_duration_seconds";
  family(f, h, "histogram",
         "Run requests from their arrival to their reply (queueing and waits for memory "
         "included), whatever their result.");
  uint64_t cum = 0;
  for (int b = 0; b <= PE_METRICS_RUN_BUCKETS; b++) {
    cum += pe_metrics_get(&c->run_buckets[b]);
    char le[32];
    if (b < PE_METRICS_RUN_BUCKETS)
      snprintf(le, sizeof le, "%g", pe_metrics_run_bounds[b]);
    else
      snprintf(le, sizeof le, "+Inf");
    sample(f, "pe_run_duration_seconds_bucket", "le", le, NULL, NULL, (double)cum);
  }
  sample(f, "pe_run_duration_seconds_sum", NULL, NULL, NULL, NULL, get(&c->run_ns_sum) * 1e-9);
  sample(f, "pe_run_duration_seconds_count", NULL, NULL, NULL, NULL, (double)cum);
  single(f, "pe_run_steps_total", "counter", "Steps (or batches) run requests have applied.",
         (double)r->runs_total);
  single(f, "pe_runs_in_flight", "gauge", "Run requests being computed.",
         (double)r->runs_in_flight);
  single(f, "pe_runs_waiting_for_memory", "gauge",
         "Run requests waiting for room in [limits] memory_runs_total or memory_total.",
         (double)r->runs_waiting_for_memory);
  single(f, "pe_worker_threads", "gauge", "Threads of the compute pool.",
         (double)r->worker_threads);
}

static void memory(FILE *f, const pe_metrics_view *v) {
  const Pe__StatusReply *r = v->status;
  single(f, "pe_memory_rss_bytes", "gauge", "The daemon's resident memory.", (double)r->rss_bytes);
  single(f, "pe_memory_host_in_use_bytes", "gauge",
         "Host tensors' bytes the host allocator has handed out.", (double)r->host_bytes_in_use);
  single(f, "pe_memory_host_cached_bytes", "gauge",
         "Bytes the host allocator keeps cached for reuse.", (double)r->host_bytes_cached);
  single(f, "pe_memory_resident_bytes", "gauge",
         "Resident in the memory budget: the models' persistables on every place and the "
         "temporaries programs keep between runs.",
         (double)r->memory_resident_bytes);
  single(f, "pe_memory_run_reserved_bytes", "gauge", "Temporaries the runs in flight reserved.",
         (double)r->run_bytes_reserved);
  single(f, "pe_memory_request_decode_bytes", "gauge", "Bytes of the decoded requests held.",
         (double)v->request_decode_bytes);
  const pe_limits *l = v->limits;
  const struct {
    const char *key;
    int64_t bytes;
  } limits[] = {
      {"memory_total", l->memory_total},
      {"memory_runs_total", l->memory_runs_total},
      {"memory_per_run", l->memory_per_run},
      {"memory_kept_per_program", l->memory_kept_per_program},
      {"memory_per_request", l->memory_per_request},
      {"memory_requests_total", l->memory_requests_total},
      {"memory_per_client", l->memory_per_client},
  };
  family(f, "pe_memory_limit_bytes", "gauge",
         "The [limits] memory keys in bytes, defaults resolved (0: unlimited).");
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
    sample(f, "pe_memory_limit_bytes", "limit", limits[i].key, NULL, NULL, (double)limits[i].bytes);
}

/* A per-model family: one sample per model whose value is known (>= 0). */
static void per_model(FILE *f, const Pe__StatusReply *r, const char *name, const char *type,
                      const char *help, double (*value)(const Pe__ModelStatus *m)) {
  family(f, name, type, help);
  for (size_t i = 0; i < r->n_models; i++) {
    double x = value(r->models[i]);
    if (x >= 0) sample(f, name, "model", r->models[i]->name, NULL, NULL, x);
  }
}

static double m_param_bytes(const Pe__ModelStatus *m) {
  return (double)m->param_bytes;
}
static double m_programs(const Pe__ModelStatus *m) {
  return m->programs;
}
static double m_persistent(const Pe__ModelStatus *m) {
  return m->persistent;
}
static double m_saved(const Pe__ModelStatus *m) {
  return (double)m->checkpoints_saved;
}
static double m_failures(const Pe__ModelStatus *m) {
  return (double)m->checkpoint_failures;
}
static double m_ckpt_age(const Pe__ModelStatus *m) {
  return m->last_checkpoint_age_s;
}
static double m_changes(const Pe__ModelStatus *m) {
  return (double)m->changes_since_checkpoint;
}
static double m_restart_changes(const Pe__ModelStatus *m) {
  return (double)m->changes_since_restart_checkpoint;
}

static void models(FILE *f, const pe_metrics_view *v) {
  const Pe__StatusReply *r = v->status;
  single(f, "pe_models", "gauge", "Models registered.", (double)r->n_models);
  single(f, "pe_programs", "gauge", "Programs registered.", r->programs);
  single(f, "pe_clients", "gauge", "Clients with a session.", r->clients);
  per_model(f, r, "pe_model_param_bytes", "gauge",
            "The model's persistables' bytes, on all its places.", m_param_bytes);
  per_model(f, r, "pe_model_programs", "gauge", "Programs registered on the model.", m_programs);
  per_model(f, r, "pe_model_persistent", "gauge",
            "1: the model outlives its programs and is checkpointed at shutdown.", m_persistent);
  per_model(f, r, "pe_model_checkpoints_saved_total", "counter",
            "Checkpoints of the model written (saves, autosaves, shutdown).", m_saved);
  per_model(f, r, "pe_model_checkpoint_failures_total", "counter",
            "Checkpoint writes of the model that failed.", m_failures);
  per_model(f, r, "pe_model_last_checkpoint_age_seconds", "gauge",
            "Seconds since the model's last checkpoint write (models written at least once).",
            m_ckpt_age);
  per_model(f, r, "pe_model_changes_since_checkpoint", "gauge",
            "Changes to the model's values since its last checkpoint write.", m_changes);
  per_model(f, r, "pe_model_changes_since_restart_checkpoint", "gauge",
            "Changes a crash would lose: since the values of the restart checkpoint.",
            m_restart_changes);
}

/* Saves and loads are requests of those kinds (ok: code OK); autosaves
 * are counted by the autosave thread. */
static void checkpoints(FILE *f, const pe_metrics_view *v) {
  const pe_metrics_counters *c = v->counters;
  family(f, "pe_checkpoints_total", "counter",
         "Checkpoint operations by kind (save and load requests, autosaves) and result.");
  static const struct {
    int kind;
    const char *op;
  } ops[] = {{PE__REQUEST__BODY_SAVE, "save"}, {PE__REQUEST__BODY_LOAD, "load"}};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    double failed = 0;
    for (int code = 1; code < PE_ECODE_COUNT; code++)
      failed += get(&c->requests[ops[i].kind][code]);
    sample(f, "pe_checkpoints_total", "op", ops[i].op, "result", "ok",
           get(&c->requests[ops[i].kind][PE_OK]));
    sample(f, "pe_checkpoints_total", "op", ops[i].op, "result", "failed", failed);
  }
  sample(f, "pe_checkpoints_total", "op", "autosave", "result", "ok", get(&c->autosaves));
  sample(f, "pe_checkpoints_total", "op", "autosave", "result", "failed",
         get(&c->autosave_failures));
  single(f, "pe_checkpoint_interval_seconds", "gauge",
         "Seconds between autosaves of the persistent models (0: off).",
         v->status->checkpoint_interval_s);
}

static void places_and_cache(FILE *f, const pe_metrics_view *v) {
  const Pe__StatusReply *r = v->status;
  family(f, "pe_place_param_bytes", "gauge",
         "Parameter bytes the models keep on the place (one replica per place).");
  for (size_t i = 0; i < r->n_places; i++)
    sample(f, "pe_place_param_bytes", "place", r->places[i]->place, NULL, NULL,
           (double)r->places[i]->bytes_in_use);
  single(f, "pe_reply_cache_entries", "gauge", "Replies kept for resent requests.",
         (double)r->reply_cache_entries);
  single(f, "pe_reply_cache_bytes", "gauge", "Bytes of the replies kept for resent requests.",
         (double)r->reply_cache_bytes);
  single(f, "pe_reply_cache_evictions_total", "counter",
         "Replies evicted from the reply cache by its bounds.", (double)r->reply_cache_evictions);
  single(f, "pe_resends_answered_total", "counter",
         "Resent requests answered from the reply cache.", (double)r->resends_answered);
  single(f, "pe_resends_waited_total", "counter",
         "Resent requests that waited for their original's reply.", (double)r->resends_waited);
  single(f, "pe_resends_stale_total", "counter",
         "Older copies of a request left unanswered (a newer copy was answered first).",
         (double)r->resends_stale);
}

char *pe_metrics_render(const pe_metrics_view *v, size_t *len) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  if (!f) return NULL;
  const Pe__StatusReply *r = v->status;
  family(f, "pe_build_info", "gauge", "The daemon's version (the value is 1).");
  sample(f, "pe_build_info", "version", r->version ? r->version : "", NULL, NULL, 1);
  single(f, "pe_uptime_seconds", "gauge", "Seconds since the daemon started.", r->uptime_s);
  requests(f, v);
  runs(f, v);
  memory(f, v);
  models(f, v);
  checkpoints(f, v);
  places_and_cache(f, v);
  bool failed = ferror(f);
  if (fclose(f) != 0 || failed) {
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}
