/* Commands about the daemon itself: ping, status, deregister. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "session_record.h"

/* --- ping ------------------------------------------------------------------------ */

typedef struct ping_cfg {
  long count;
} ping_cfg;

static const cli_opt ping_opts[] = {
    {"count", CLI_INT, offsetof(ping_cfg, count), 1, 1000000, "pings to send (1)"},
};

static int cmd_ping(cli_ctx *ctx, int argc, char **argv) {
  ping_cfg cfg = {.count = 1};
  bool help;
  int rc = cli_parse(ctx, ping_opts, 1, argc, argv, &cfg, &help);
  if (rc || help) return rc;
  pe_client *c = cli_connect(ctx, &rc);
  if (!c) return rc;
  double best = 1e30, sum = 0;
  for (long i = 0; i < cfg.count && !rc; i++) {
    double t0 = cli_now();
    int code = pe_client_ping(c);
    if (code) {
      rc = cli_fail(ctx, c, code);
      break;
    }
    double us = (cli_now() - t0) * 1e6;
    sum += us;
    if (us < best) best = us;
  }
  if (!rc) {
    if (ctx->json) {
      cli_json_begin(ctx);
      printf(",\"socket\":");
      cli_json_str(stdout, pe_client_address(c));
      printf(",\"count\":%ld,\"mean_us\":%.1f,\"min_us\":%.1f}\n", cfg.count, sum / cfg.count,
             best);
    } else {
      printf("pong from %s: %ld ping(s), mean %.0f us, min %.0f us\n", pe_client_address(c),
             cfg.count, sum / cfg.count, best);
    }
  }
  cli_end(ctx, c, rc);
  return rc;
}

/* --- status ---------------------------------------------------------------------- */

static void print_status_json(const cli_ctx *ctx, const pe_client_status *s) {
  cli_json_begin(ctx);
  printf(",\"version\":");
  cli_json_str(stdout, s->version);
  printf(
      ",\"uptime_s\":%.1f,\"programs\":%d,\"queue_depth\":%d,\"clients\":%d,"
      "\"worker_threads\":%d,\"requests_total\":%llu,\"requests_failed\":%llu,"
      "\"runs_total\":%llu,\"reply_cache_entries\":%llu,\"reply_cache_bytes\":%llu,"
      "\"resends_answered\":%llu,\"resends_waited\":%llu,\"resends_stale\":%llu,"
      "\"reply_cache_evictions\":%llu,\"checkpoint_interval_s\":%.3f,\"runs_in_flight\":%d,"
      "\"rss_bytes\":%llu,\"host_bytes_in_use\":%llu,\"host_bytes_cached\":%llu,"
      "\"run_bytes_reserved\":%llu,\"runs_waiting_for_memory\":%d,\"memory_total_bytes\":%llu,"
      "\"memory_resident_bytes\":%llu,\"places\":[",
      s->uptime_s, s->programs, s->queue_depth, s->clients, s->worker_threads,
      (unsigned long long)s->requests_total, (unsigned long long)s->requests_failed,
      (unsigned long long)s->runs_total, (unsigned long long)s->reply_cache_entries,
      (unsigned long long)s->reply_cache_bytes, (unsigned long long)s->resends_answered,
      (unsigned long long)s->resends_waited, (unsigned long long)s->resends_stale,
      (unsigned long long)s->reply_cache_evictions, s->checkpoint_interval_s, s->runs_in_flight,
      (unsigned long long)s->rss_bytes, (unsigned long long)s->host_bytes_in_use,
      (unsigned long long)s->host_bytes_cached, (unsigned long long)s->run_bytes_reserved,
      s->runs_waiting_for_memory, (unsigned long long)s->memory_total_bytes,
      (unsigned long long)s->memory_resident_bytes);
  for (size_t i = 0; i < s->n_places; i++) {
    printf("%s{\"place\":", i ? "," : "");
    cli_json_str(stdout, s->places[i].place);
    printf(",\"bytes_in_use\":%lld,\"bytes_cached\":%lld}", (long long)s->places[i].bytes_in_use,
           (long long)s->places[i].bytes_cached);
  }
  printf("],\"models\":[");
  for (size_t i = 0; i < s->n_models; i++) {
    printf("%s{\"name\":", i ? "," : "");
    cli_json_str(stdout, s->models[i].name);
    const pe_client_model_status *m = &s->models[i];
    printf(
        ",\"programs\":%d,\"param_bytes\":%lld,\"persistent\":%s,\"checkpoints_saved\":%llu,"
        "\"checkpoint_failures\":%llu,\"last_checkpoint\":",
        m->programs, (long long)m->param_bytes, m->persistent ? "true" : "false",
        (unsigned long long)m->checkpoints_saved, (unsigned long long)m->checkpoint_failures);
    cli_json_str(stdout, m->last_checkpoint);
    printf(",\"last_checkpoint_age_s\":%.3f,\"last_checkpoint_error\":", m->last_checkpoint_age_s);
    cli_json_str(stdout, m->last_checkpoint_error);
    printf(",\"changes_since_checkpoint\":%lld,\"restart_checkpoint\":",
           (long long)m->changes_since_checkpoint);
    cli_json_str(stdout, m->restart_checkpoint);
    printf(
        ",\"restart_checkpoint_age_s\":%.3f,\"changes_since_restart_checkpoint\":%lld,"
        "\"restart_checkpoint_read\":%s",
        m->restart_checkpoint_age_s, (long long)m->changes_since_restart_checkpoint,
        m->restart_checkpoint_read ? "true" : "false");
    if (m->places_trial.present) {
      printf(",\"places_trial\":");
      cli_json_places_trial(stdout, &m->places_trial);
    }
    putchar('}');
  }
  printf("],\"lanes\":[");
  for (size_t i = 0; i < s->n_lanes; i++) {
    printf("%s{\"name\":", i ? "," : "");
    cli_json_str(stdout, s->lanes[i].name);
    printf(",\"threads\":%d,\"busy\":%d,\"queued\":%d}", s->lanes[i].threads, s->lanes[i].busy,
           s->lanes[i].queued);
  }
  printf("],\"runs\":[");
  for (size_t i = 0; i < s->n_runs; i++) {
    const pe_client_run_status *r = &s->runs[i];
    printf("%s{\"client\":", i ? "," : "");
    cli_json_str(stdout, r->client);
    printf(",\"model\":");
    cli_json_str(stdout, r->model);
    printf(",\"handle\":\"0x%016llx\",\"steps_done\":%u,\"steps_total\":%u,\"age_s\":%.3f}",
           (unsigned long long)r->handle, r->steps_done, r->steps_total, r->age_s);
  }
  printf("]}\n");
}

static void print_status_text(const pe_client_status *s) {
  printf("pe-executord %s, up %.1f s, %d worker thread(s)\n", s->version, s->uptime_s,
         s->worker_threads);
  printf(
      "requests %llu (%llu failed), runs %llu (%d in flight), queue depth %d, clients %d, "
      "programs %d\n",
      (unsigned long long)s->requests_total, (unsigned long long)s->requests_failed,
      (unsigned long long)s->runs_total, s->runs_in_flight, s->queue_depth, s->clients,
      s->programs);
  for (size_t i = 0; i < s->n_lanes; i++)
    printf("%s %s lane: %d thread(s), %d busy, %d queued%s", i ? ";" : "request", s->lanes[i].name,
           s->lanes[i].threads, s->lanes[i].busy, s->lanes[i].queued,
           i + 1 == s->n_lanes ? "\n" : "");
  for (size_t i = 0; i < s->n_runs; i++)
    printf("  run of client %s on model %s (program 0x%016llx): %u of %u steps, %.1f s\n",
           s->runs[i].client, s->runs[i].model, (unsigned long long)s->runs[i].handle,
           s->runs[i].steps_done, s->runs[i].steps_total, s->runs[i].age_s);
  printf(
      "resends: %llu answered from the reply cache, %llu waited for the original, %llu stale; "
      "cache %llu replies, %llu bytes, %llu evicted\n",
      (unsigned long long)s->resends_answered, (unsigned long long)s->resends_waited,
      (unsigned long long)s->resends_stale, (unsigned long long)s->reply_cache_entries,
      (unsigned long long)s->reply_cache_bytes, (unsigned long long)s->reply_cache_evictions);
  printf(
      "memory: %llu bytes resident; host tensors %llu bytes in use, %llu cached; runs reserved "
      "%llu bytes, %d waiting for memory\n",
      (unsigned long long)s->rss_bytes, (unsigned long long)s->host_bytes_in_use,
      (unsigned long long)s->host_bytes_cached, (unsigned long long)s->run_bytes_reserved,
      s->runs_waiting_for_memory);
  if (s->memory_total_bytes)
    printf("memory budget (memory_total): %llu bytes; %llu resident (models, kept temporaries)\n",
           (unsigned long long)s->memory_total_bytes, (unsigned long long)s->memory_resident_bytes);
  for (size_t i = 0; i < s->n_places; i++)
    printf("place %-8s %12lld bytes in use, %12lld cached\n", s->places[i].place,
           (long long)s->places[i].bytes_in_use, (long long)s->places[i].bytes_cached);
  if (s->checkpoint_interval_s > 0)
    printf("autosave every %.3g s\n", s->checkpoint_interval_s);
  else
    printf("autosave off\n");
  for (size_t i = 0; i < s->n_models; i++) {
    const pe_client_model_status *m = &s->models[i];
    printf("model %-16s %d program(s), %lld parameter bytes%s\n", m->name, m->programs,
           (long long)m->param_bytes, m->persistent ? ", persistent" : "");
    if (m->places_trial.present) {
      fputs("  ", stdout);
      cli_print_places_trial(stdout, &m->places_trial);
    }
    /* What a crash would lose: changes since the restart checkpoint (a
     * named save is not what a restart restores). */
    if (m->persistent && m->restart_checkpoint_age_s >= 0)
      printf("  restart checkpoint '%s' %s %.1f s ago, %lld change(s) since (a crash loses them)\n",
             m->restart_checkpoint, m->restart_checkpoint_read ? "restored" : "written",
             m->restart_checkpoint_age_s, (long long)m->changes_since_restart_checkpoint);
    else if (m->persistent)
      printf("  no restart checkpoint '%s' yet: a crash loses every value\n",
             m->restart_checkpoint);
    if (m->checkpoints_saved)
      printf("  newest checkpoint '%s' written %.1f s ago, %lld change(s) since; %llu written\n",
             m->last_checkpoint, m->last_checkpoint_age_s, (long long)m->changes_since_checkpoint,
             (unsigned long long)m->checkpoints_saved);
    if (m->checkpoint_failures)
      printf("  %llu checkpoint write(s) failed, the newest: %s\n",
             (unsigned long long)m->checkpoint_failures, m->last_checkpoint_error);
  }
}

static int cmd_status(cli_ctx *ctx, int argc, char **argv) {
  bool help;
  int rc = cli_parse(ctx, NULL, 0, argc, argv, NULL, &help);
  if (rc || help) return rc;
  pe_client *c = cli_connect(ctx, &rc);
  if (!c) return rc;
  pe_client_status s;
  int code = pe_client_get_status(c, &s);
  if (code)
    rc = cli_fail(ctx, c, code);
  else if (ctx->json)
    print_status_json(ctx, &s);
  else
    print_status_text(&s);
  cli_end(ctx, c, rc);
  return rc;
}

/* --- deregister ------------------------------------------------------------------ */

typedef struct dereg_cfg {
  const char *handle;
  bool force;
} dereg_cfg;

/* Each pe-client command is a client of its own. A program that a
 * `pe-client register` of this user made is deregistered in that
 * register's session (session_record.h), as its owner. Any other program:
 * without --force the daemon refuses, naming the program's owners, and
 * with it drops the program for all of them. */
static const cli_opt dereg_opts[] = {
    {"handle", CLI_STR, offsetof(dereg_cfg, handle), 0, 0, "program handle (from register)"},
    {"force", CLI_FLAG, offsetof(dereg_cfg, force), 0, 0,
     "drop it although other clients use it (their runs fail)"},
};

static int cmd_deregister(cli_ctx *ctx, int argc, char **argv) {
  dereg_cfg cfg = {0};
  bool help;
  int rc =
      cli_parse(ctx, dereg_opts, sizeof dereg_opts / sizeof dereg_opts[0], argc, argv, &cfg, &help);
  if (rc || help) return rc;
  uint64_t h;
  if (!cfg.handle || cli_handle_parse(cfg.handle, &h))
    return cli_usage(ctx, "--handle needs a program handle (0x... or decimal)");
  pe_client *c = cli_connect(ctx, &rc);
  if (!c) return rc;
  char address[512];
  snprintf(address, sizeof address, "%s", pe_client_address(c));
  cli_session s;
  bool borrowed = !cfg.force && cli_session_load(address, h, &s);
  if (borrowed) {
    pe_client_free(c);
    pe_client_opts o = {.outlive_process = true,
                        .session_client_id = s.client_id,
                        .session_last_request = s.last_request};
    if (!(c = cli_connect_with(ctx, o, &rc))) return rc;
  }
  int code = cfg.force ? pe_client_deregister_force(c, h) : pe_client_deregister(c, h);
  if (!code || code == PE_C_ENOTFOUND) cli_session_forget(address, h);
  char hs[24];
  cli_handle_str(h, hs);
  if (code) {
    rc = cli_fail(ctx, c, code);
  } else if (ctx->json) {
    cli_json_begin(ctx);
    printf(",\"handle\":\"%s\"}\n", hs);
  } else {
    printf("deregistered %s\n", hs);
  }
  /* The register's session ends with its program; after a failure it is
   * left as it was (it may still hold the program). */
  if (borrowed && rc)
    pe_client_free(c);
  else
    cli_end(ctx, c, rc);
  return rc;
}

const cli_cmd cli_cmds_daemon[] = {
    {"ping", "[--count N]", "check that the daemon answers", cmd_ping},
    {"status", "", "devices, models, programs, memory, counters", cmd_status},
    {"deregister", "--handle H [--force]", "drop a registered program", cmd_deregister},
    {NULL, NULL, NULL, NULL},
};
