/* The Prometheus page (daemon/server/metrics/render.c) of a made-up Status
 * reply and counters: every family has its HELP and TYPE lines before its
 * samples, once; requests by kind and code; the run latency histogram's
 * buckets (counted by metrics/counters.c) are cumulative and +Inf is the
 * count; models, places, lanes, limits and checkpoints; label values are
 * escaped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "metrics_sample.h"
#include "server/metrics/counters.h"
#include "server/metrics/render.h"

/* A Status reply of one model on two places, with the lanes. */
typedef struct fixture {
  Pe__StatusReply r;
  Pe__ModelStatus model, *models[1];
  Pe__PlaceStatus place[2], *places[2];
  Pe__LaneStatus lane[3], *lanes[3];
  pe_metrics_counters counters;
  pe_limits limits;
} fixture;

static void fixture_init(fixture *x, const char *model_name) {
  memset(x, 0, sizeof *x);
  pe__status_reply__init(&x->r);
  x->r.version = (char *)"9.8.7";
  x->r.uptime_s = 12.5;
  x->r.requests_total = 41;
  x->r.requests_failed = 3;
  x->r.runs_total = 700;
  x->r.queue_depth = 2;
  x->r.programs = 2;
  x->r.clients = 1;
  x->r.rss_bytes = 1000000;
  x->r.memory_resident_bytes = 4096;
  x->r.run_bytes_reserved = 512;
  x->r.checkpoint_interval_s = 300;
  pe__model_status__init(&x->model);
  x->model.name = (char *)model_name;
  x->model.programs = 2;
  x->model.param_bytes = 2048;
  x->model.persistent = true;
  x->model.checkpoints_saved = 5;
  x->model.checkpoint_failures = 1;
  x->model.last_checkpoint_age_s = -1; /* unknown: no sample */
  x->model.changes_since_checkpoint = 7;
  x->model.changes_since_restart_checkpoint = -1;
  x->models[0] = &x->model;
  x->r.models = x->models;
  x->r.n_models = 1;
  static const char *const place_names[] = {"cpu:0", "cpu:1"};
  for (int i = 0; i < 2; i++) {
    pe__place_status__init(&x->place[i]);
    x->place[i].place = (char *)place_names[i];
    x->place[i].bytes_in_use = 1024 * (uint64_t)(i + 1);
    x->places[i] = &x->place[i];
  }
  x->r.places = x->places;
  x->r.n_places = 2;
  static const char *const lane_names[] = {"work", "control", "run"};
  for (int i = 0; i < 3; i++) {
    pe__lane_status__init(&x->lane[i]);
    x->lane[i].name = (char *)lane_names[i];
    x->lane[i].threads = 8 + i;
    x->lane[i].busy = i;
    x->lane[i].queued = 10 * i;
    x->lanes[i] = &x->lane[i];
  }
  x->r.lanes = x->lanes;
  x->r.n_lanes = 3;
  x->limits.memory_total = 1 << 30;
  x->limits.memory_per_request = 3 << 20;
}

/* Replies to count: kind (a body case), code, seconds. */
typedef struct reply {
  int kind, code;
  double seconds;
} reply;

static void count_replies(fixture *x, const reply *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    pe_metrics_count_reply(&x->counters, r[i].kind, r[i].code, r[i].seconds);
}

/* The page of x (free it). */
static char *render(fixture *x) {
  pe_metrics_view v = {
      .status = &x->r, .counters = &x->counters, .limits = &x->limits, .request_decode_bytes = 777};
  size_t len = 0;
  char *text = pe_metrics_render(&v, &len);
  ck_assert_ptr_nonnull(text);
  ck_assert_uint_eq(len, strlen(text));
  ck_assert_msg(len > 0 && text[len - 1] == '\n', "the page ends without a newline");
  return text;
}

static bool has_series(const char *text, const char *prefix) {
  return strstr(text, prefix) != NULL;
}

START_TEST(test_families_have_help_and_type_once) {
  fixture x;
  fixture_init(&x, "mlp");
  pe_metrics_count_reply(&x.counters, PE__REQUEST__BODY_RUN, PE_OK, 0.01);
  char *text = render(&x);
  char family[256] = "", type[32] = "";
  char declared[128][128];
  int n_declared = 0, samples = 0;
  char *save = NULL;
  char *copy = strdup(text);
  for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char name[128];
    if (!strncmp(line, "# HELP ", 7)) {
      ck_assert_int_eq(sscanf(line + 7, "%127s", name), 1);
      for (int i = 0; i < n_declared; i++)
        ck_assert_msg(strcmp(declared[i], name), "family %s declared twice", name);
      ck_assert_int_lt(n_declared, 128);
      snprintf(declared[n_declared++], sizeof declared[0], "%s", name);
      snprintf(family, sizeof family, "%s", name);
      type[0] = 0;
      ck_assert_msg(strlen(line) > 8 + strlen(name), "HELP of %s has no text", name);
      continue;
    }
    if (!strncmp(line, "# TYPE ", 7)) {
      char t[32];
      ck_assert_int_eq(sscanf(line + 7, "%127s %31s", name, t), 2);
      ck_assert_msg(!strcmp(name, family) && !type[0], "TYPE %s not right after its HELP", name);
      ck_assert_msg(!strcmp(t, "counter") || !strcmp(t, "gauge") || !strcmp(t, "histogram"),
                    "type %s of %s", t, name);
      snprintf(type, sizeof type, "%s", t);
      continue;
    }
    ck_assert_msg(line[0] != '#', "stray comment: %s", line);
    samples++;
    size_t k = strcspn(line, "{ ");
    ck_assert_msg(k < sizeof name, "%s", line);
    memcpy(name, line, k);
    name[k] = 0;
    ck_assert_msg(type[0], "sample %s before any TYPE", line);
    /* A sample belongs to the family declared last (a histogram's by its
     * suffixes); a counter's name ends in _total. */
    size_t fl = strlen(family);
    bool mine =
        !strcmp(name, family) || (!strcmp(type, "histogram") && !strncmp(name, family, fl) &&
                                  (!strcmp(name + fl, "_bucket") || !strcmp(name + fl, "_sum") ||
                                   !strcmp(name + fl, "_count")));
    ck_assert_msg(mine, "sample %s under family %s", line, family);
    if (!strcmp(type, "counter"))
      ck_assert_msg(fl > 6 && !strcmp(family + fl - 6, "_total"), "counter %s", family);
    /* The value parses whole. */
    const char *val = strrchr(line, ' ') + 1;
    char *end;
    strtod(val, &end);
    ck_assert_msg(end != val && *end == 0, "value of %s", line);
  }
  ck_assert_int_gt(n_declared, 30);
  ck_assert_int_gt(samples, n_declared);
  free(copy);
  free(text);
}
END_TEST

START_TEST(test_requests_by_kind_and_code) {
  fixture x;
  fixture_init(&x, "mlp");
  const reply replies[] = {
      {PE__REQUEST__BODY_RUN, PE_OK, 0.01},
      {PE__REQUEST__BODY_RUN, PE_OK, 0.02},
      {PE__REQUEST__BODY_RUN, PE_ESHAPE, 0.01},
      {PE__REQUEST__BODY_REGISTER, PE_OK, 0.5},
      {PE_METRICS_KIND_UNDECODED, PE_EINVAL, 0},
      {1000, 1000, 0}, /* out of range: kind "none", code INTERNAL */
  };
  count_replies(&x, replies, sizeof replies / sizeof replies[0]);
  char *text = render(&x);
  ck_assert_double_eq(metrics_sample(text, "pe_requests_total{kind=\"run\",code=\"OK\"}"), 2);
  ck_assert_double_eq(
      metrics_sample(text, "pe_requests_total{kind=\"run\",code=\"SHAPE_MISMATCH\"}"), 1);
  ck_assert_double_eq(metrics_sample(text, "pe_requests_total{kind=\"register\",code=\"OK\"}"), 1);
  ck_assert_double_eq(
      metrics_sample(text, "pe_requests_total{kind=\"undecodable\",code=\"INVALID_ARGUMENT\"}"), 1);
  ck_assert_double_eq(metrics_sample(text, "pe_requests_total{kind=\"none\",code=\"INTERNAL\"}"),
                      1);
  /* Never counted: no series. */
  ck_assert(!has_series(text, "pe_requests_total{kind=\"ping\""));
  ck_assert(!has_series(text, "pe_requests_total{kind=\"register\",code=\"SHAPE_MISMATCH\"}"));
  /* The Status counters beside them. */
  ck_assert_double_eq(metrics_sample(text, "pe_requests_received_total"), 41);
  ck_assert_double_eq(metrics_sample(text, "pe_requests_failed_total"), 3);
  ck_assert_double_eq(metrics_sample(text, "pe_run_steps_total"), 700);
  free(text);
}
END_TEST

START_TEST(test_run_histogram_cumulative) {
  fixture x;
  fixture_init(&x, "mlp");
  /* A bound is inclusive (le); over 10 s is +Inf only; NaN counts as 0. */
  const double runs[] = {0.0005, 0.001, 0.003, 0.2, 0.2, 20, NAN};
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
    pe_metrics_count_reply(&x.counters, PE__REQUEST__BODY_RUN, i == 3 ? PE_EINVAL : PE_OK, runs[i]);
  /* Other kinds are not runs. */
  pe_metrics_count_reply(&x.counters, PE__REQUEST__BODY_INIT, PE_OK, 0.003);
  char *text = render(&x);
  ck_assert_double_eq(metrics_sample(text, "pe_run_duration_seconds_bucket{le=\"0.001\"}"), 3);
  ck_assert_double_eq(metrics_sample(text, "pe_run_duration_seconds_bucket{le=\"0.0025\"}"), 3);
  ck_assert_double_eq(metrics_sample(text, "pe_run_duration_seconds_bucket{le=\"0.005\"}"), 4);
  ck_assert_double_eq(metrics_sample(text, "pe_run_duration_seconds_bucket{le=\"0.1\"}"), 4);
  ck_assert_double_eq(metrics_sample(text, "pe_run_duration_seconds_bucket{le=\"0.25\"}"), 6);
  ck_assert_double_eq(metrics_sample(text, "pe_run_duration_seconds_bucket{le=\"10\"}"), 6);
  ck_assert_double_eq(metrics_sample(text, "pe_run_duration_seconds_bucket{le=\"+Inf\"}"), 7);
  ck_assert_double_eq(metrics_sample(text, "pe_run_duration_seconds_count"), 7);
  ck_assert_double_eq_tol(metrics_sample(text, "pe_run_duration_seconds_sum"), 20.4045, 1e-6);
  /* Every bucket in order, none smaller than the one before. */
  double prev = 0;
  for (int b = 0; b < PE_METRICS_RUN_BUCKETS; b++) {
    char series[96];
    snprintf(series, sizeof series, "pe_run_duration_seconds_bucket{le=\"%g\"}",
             pe_metrics_run_bounds[b]);
    double v = metrics_sample(text, series);
    ck_assert_msg(v >= prev, "%s %g after %g", series, v, prev);
    prev = v;
  }
  ck_assert(strstr(text, "le=\"10\"") < strstr(text, "le=\"+Inf\""));
  free(text);
}
END_TEST

START_TEST(test_models_places_memory_checkpoints) {
  fixture x;
  fixture_init(&x, "m\"x\\y\nz");
  const reply replies[] = {
      {PE__REQUEST__BODY_SAVE, PE_OK, 0},
      {PE__REQUEST__BODY_SAVE, PE_EIO, 0},
      {PE__REQUEST__BODY_SAVE, PE_ENOTFOUND, 0},
      {PE__REQUEST__BODY_LOAD, PE_OK, 0},
  };
  count_replies(&x, replies, sizeof replies / sizeof replies[0]);
  for (int i = 0; i < 3; i++) pe_metrics_count_autosave(&x.counters, i < 2);
  pe_metrics_count_autosave(NULL, true); /* no counters: nothing */
  char *text = render(&x);
  /* The model's name escaped in its label. */
  const char *m = "{model=\"m\\\"x\\\\y\\nz\"}";
  char series[128];
  snprintf(series, sizeof series, "pe_model_param_bytes%s", m);
  ck_assert_double_eq(metrics_sample(text, series), 2048);
  snprintf(series, sizeof series, "pe_model_checkpoints_saved_total%s", m);
  ck_assert_double_eq(metrics_sample(text, series), 5);
  snprintf(series, sizeof series, "pe_model_checkpoint_failures_total%s", m);
  ck_assert_double_eq(metrics_sample(text, series), 1);
  snprintf(series, sizeof series, "pe_model_changes_since_checkpoint%s", m);
  ck_assert_double_eq(metrics_sample(text, series), 7);
  snprintf(series, sizeof series, "pe_model_persistent%s", m);
  ck_assert_double_eq(metrics_sample(text, series), 1);
  /* Unknown (-1): no sample. */
  ck_assert(!has_series(text, "pe_model_last_checkpoint_age_seconds{"));
  ck_assert(!has_series(text, "pe_model_changes_since_restart_checkpoint{"));
  ck_assert_double_eq(metrics_sample(text, "pe_models"), 1);
  ck_assert_double_eq(metrics_sample(text, "pe_programs"), 2);
  ck_assert_double_eq(metrics_sample(text, "pe_place_param_bytes{place=\"cpu:0\"}"), 1024);
  ck_assert_double_eq(metrics_sample(text, "pe_place_param_bytes{place=\"cpu:1\"}"), 2048);
  ck_assert_double_eq(metrics_sample(text, "pe_lane_threads{lane=\"run\"}"), 10);
  ck_assert_double_eq(metrics_sample(text, "pe_lane_queued{lane=\"control\"}"), 10);
  ck_assert_double_eq(metrics_sample(text, "pe_lane_busy{lane=\"run\"}"), 2);
  ck_assert_double_eq(metrics_sample(text, "pe_queue_depth"), 2);
  ck_assert_double_eq(metrics_sample(text, "pe_memory_resident_bytes"), 4096);
  ck_assert_double_eq(metrics_sample(text, "pe_memory_run_reserved_bytes"), 512);
  ck_assert_double_eq(metrics_sample(text, "pe_memory_request_decode_bytes"), 777);
  ck_assert_double_eq(metrics_sample(text, "pe_memory_limit_bytes{limit=\"memory_total\"}"),
                      1 << 30);
  ck_assert_double_eq(metrics_sample(text, "pe_memory_limit_bytes{limit=\"memory_per_request\"}"),
                      3 << 20);
  ck_assert_double_eq(metrics_sample(text, "pe_memory_limit_bytes{limit=\"memory_runs_total\"}"),
                      0);
  ck_assert_double_eq(metrics_sample(text, "pe_checkpoints_total{op=\"save\",result=\"ok\"}"), 1);
  ck_assert_double_eq(metrics_sample(text, "pe_checkpoints_total{op=\"save\",result=\"failed\"}"),
                      2);
  ck_assert_double_eq(metrics_sample(text, "pe_checkpoints_total{op=\"load\",result=\"ok\"}"), 1);
  ck_assert_double_eq(metrics_sample(text, "pe_checkpoints_total{op=\"load\",result=\"failed\"}"),
                      0);
  ck_assert_double_eq(metrics_sample(text, "pe_checkpoints_total{op=\"autosave\",result=\"ok\"}"),
                      2);
  ck_assert_double_eq(
      metrics_sample(text, "pe_checkpoints_total{op=\"autosave\",result=\"failed\"}"), 1);
  ck_assert_double_eq(metrics_sample(text, "pe_checkpoint_interval_seconds"), 300);
  ck_assert_double_eq(metrics_sample(text, "pe_uptime_seconds"), 12.5);
  ck_assert(has_series(text, "pe_build_info{version=\"9.8.7\"} 1\n"));
  free(text);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("metrics_render");
  TCase *tc = tcase_create("render");
  tcase_add_test(tc, test_families_have_help_and_type_once);
  tcase_add_test(tc, test_requests_by_kind_and_code);
  tcase_add_test(tc, test_run_histogram_cumulative);
  tcase_add_test(tc, test_models_places_memory_checkpoints);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
