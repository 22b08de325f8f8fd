/* pe-executord end to end, places = auto on cpu (server/places_trial.h):
 * the register of a new model runs the trial and reports it (the register
 * reply, status), writes the remembered choice, and the next register of
 * the program (another model name) reads it instead; a corrupt remembered
 * choice is ignored with a warning and the trial runs again; a model
 * trained after the trial has the parameters, bit for bit, of one
 * registered with the chosen places and strategy by hand, and of one in a
 * daemon started with those places; a model restored after a restart comes
 * back on the places it trained on; an evaluation
 * program or a register that names its places runs no trial; pe-client
 * train --json and status --json report the trial. */
#include <dirent.h>
#include <pthread.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "test_assert.h"

#define CLIENT 0x91ad1
#define STEPS 3

/* The one *.choice file under dir/places (its name into name). */
static int choice_files(const char *state, char *name, size_t cap) {
  char dir[1100];
  snprintf(dir, sizeof dir, "%s/places", state);
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".choice")) {
      snprintf(name, cap, "%s/%s", dir, e->d_name);
      n++;
    }
  closedir(d);
  return n;
}

static const Pe__PlacesTrial *model_trial(const Pe__Reply *st, const char *model) {
  for (size_t i = 0; i < st->status->n_models; i++)
    if (!strcmp(st->status->models[i]->name, model)) return st->status->models[i]->places_trial;
  ck_abort_msg("model '%s' not in status", model);
  return NULL;
}

/* Register mlp under model (auto strategy, batch hint 16), check the
 * trial's report; the reply. */
static Pe__Reply *register_auto_as(int s, const pe_model_spec *mlp, const char *model,
                                   bool remembered, bool persistent) {
  dh_places = NULL;
  dh_strategy = PE__STRATEGY__AUTO;
  dh_fuse = false;
  dh_batch_hint = 16;
  Pe__Reply *rep = dh_register_call(s, CLIENT, mlp, model, 3, persistent);
  dh_ok(rep);
  const Pe__PlacesTrial *t = rep->register_->places_trial;
  ck_assert_msg(t != NULL, "register of '%s' reports no places trial", model);
  ck_assert_int_eq(t->remembered, remembered);
  ck_assert_int_eq(t->batch, 16);
  ck_assert_str_eq(t->places, rep->register_->places);
  ck_assert_int_ge((int)t->n_candidates, 1);
  ck_assert_str_eq(t->candidates[0]->places, "cpu:1");
  /* The chosen one was measured and no measured one is faster. */
  double best = 0;
  bool found = false;
  for (size_t i = 0; i < t->n_candidates; i++) {
    const Pe__PlacesCandidate *c = t->candidates[i];
    if (c->step_ms > 0 && (best == 0 || c->step_ms < best)) best = c->step_ms;
    if (!strcmp(c->places, t->places) && c->strategy == t->strategy && c->fused == t->fused)
      found = true;
  }
  ck_assert_msg(found, "the choice %s is not a candidate", t->places);
  ck_assert(best > 0);
  if (strcmp(t->places, "cpu:1")) ck_assert_int_eq(t->strategy, rep->register_->strategy);
  return rep;
}

static Pe__Reply *register_auto(int s, const pe_model_spec *mlp, const char *model,
                                bool remembered) {
  return register_auto_as(s, mlp, model, remembered, false);
}

/* A daemon with places = auto (the harness's --places cpu:1 overridden) and conf. */
static void start_auto(dh_daemon *d, const char *conf) {
  d->args[0] = "--places";
  d->args[1] = "auto";
  dh_start(d, conf);
}

START_TEST(test_places_auto_trial) {
  dh_daemon d = {0};
  start_auto(&d, "[runtime]\nplaces_trial_steps = 2\n");
  int s = dh_connect(&d, 60000);
  pe_model_spec mlp = dh_mlp();
  dh_batch b;
  dh_batch_make(&b, 16, 3);

  /* 1. A trial, reported, remembered. */
  Pe__Reply *rep = register_auto(s, &mlp, "a", false);
  uint64_t ha = rep->register_->handle;
  char places[32];
  snprintf(places, sizeof places, "%s", rep->register_->places_trial->places);
  Pe__Strategy strategy = rep->register_->places_trial->strategy;
  bool fused = rep->register_->places_trial->fused;
  /* Every candidate held at once and timed in the same rounds. */
  char held[64];
  snprintf(held, sizeof held, "(%d held at once)", (int)rep->register_->places_trial->n_candidates);
  ck_assert_msg(dh_log_has(&d, held), "the trial's log has no '%s' (log %s)", held, d.log);
  pe__reply__free_unpacked(rep, NULL);
  char file[1400];
  ck_assert_int_eq(choice_files(d.state, file, sizeof file), 1);
  dh_init_ok(s, CLIENT, ha);
  dh_run_loss(s, CLIENT, ha, &b, mlp.loss, STEPS);

  /* Status reports it for the model. */
  Pe__Request rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *st = dh_call(s, &rq);
  dh_ok(st);
  const Pe__PlacesTrial *t = model_trial(st, "a");
  ck_assert_ptr_nonnull(t);
  ck_assert_str_eq(t->places, places);
  ck_assert(!t->remembered);
  pe__reply__free_unpacked(st, NULL);

  /* Another training program of the model (another seed: another handle)
   * that leaves the strategy to the daemon: the trial's, not the default
   * (which a model trained with another strategy refuses). */
  dh_strategy = PE__STRATEGY__AUTO;
  rep = dh_register_call(s, CLIENT, &mlp, "a", 4, false);
  dh_ok(rep);
  ck_assert_str_eq(rep->register_->places, places);
  if (strcmp(places, "cpu:1")) ck_assert_int_eq(rep->register_->strategy, strategy);
  pe__reply__free_unpacked(rep, NULL);

  /* 2. The same program under another name: the remembered choice. */
  rep = register_auto(s, &mlp, "b", true);
  ck_assert_str_eq(rep->register_->places, places);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert_int_eq(choice_files(d.state, file, sizeof file), 1);

  /* 3. Corrupt: ignored with a warning; the trial runs again and rewrites it. */
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fputs("pe-places-choice 1\nmachine nonsense\n\x01", f);
  fclose(f);
  rep = register_auto(s, &mlp, "c", false);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_log_has(&d, "ignoring the remembered choice"));
  rep = register_auto(s, &mlp, "c2", true);
  pe__reply__free_unpacked(rep, NULL);

  /* 4. By hand: the chosen places and strategy named; the same training. */
  dh_places = places;
  dh_strategy = strategy;
  dh_fuse = fused;
  dh_batch_hint = 0;
  rep = dh_register_call(s, CLIENT, &mlp, "h", 3, false);
  dh_ok(rep);
  ck_assert_msg(rep->register_->places_trial == NULL, "named places ran a trial");
  uint64_t hh = rep->register_->handle;
  pe__reply__free_unpacked(rep, NULL);
  dh_init_ok(s, CLIENT, hh);
  dh_run_loss(s, CLIENT, hh, &b, mlp.loss, STEPS);
  Pe__Reply *pa = dh_get_all(s, CLIENT, "a"), *ph = dh_get_all(s, CLIENT, "h");
  const char *differs = dh_params_differ(pa, ph);
  ck_assert_msg(differs == NULL, "'%s' differs between the trial's choice and %s by hand", differs,
                places);
  pe__reply__free_unpacked(ph, NULL);
  /* And in a daemon started with those places. */
  dh_daemon d2 = {0};
  d2.args[0] = "--places";
  d2.args[1] = places;
  dh_start(&d2, NULL);
  int s2 = dh_connect(&d2, 60000);
  dh_places = NULL;
  rep = dh_register_call(s2, CLIENT, &mlp, "a", 3, false);
  dh_ok(rep);
  ck_assert_str_eq(rep->register_->places, places);
  uint64_t h2 = rep->register_->handle;
  pe__reply__free_unpacked(rep, NULL);
  dh_init_ok(s2, CLIENT, h2);
  dh_run_loss(s2, CLIENT, h2, &b, mlp.loss, STEPS);
  Pe__Reply *p2 = dh_get_all(s2, CLIENT, "a");
  differs = dh_params_differ(pa, p2);
  ck_assert_msg(differs == NULL, "'%s' differs between the trial's choice and a daemon on %s",
                differs, places);
  pe__reply__free_unpacked(p2, NULL);
  pe__reply__free_unpacked(pa, NULL);
  nn_close(s2);
  ck_assert_int_eq(dh_stop(&d2, SIGTERM), 0);
  dh_cleanup(&d2);

  /* 5. An evaluation program of a new model: no trial. */
  dh_places = NULL;
  dh_for_test = true;
  rep = dh_register_call(s, CLIENT, &mlp, "e", 3, false);
  dh_for_test = false;
  dh_ok(rep);
  ck_assert(rep->register_->places_trial == NULL);
  pe__reply__free_unpacked(rep, NULL);

  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

/* Rewrite the remembered choice at path (the trial's header kept) so that
 * it chose cpu:2, all-reduce fused, over cpu:1: a machine where the trial
 * picks cpu:1 still tests what follows a cpu:2 choice. */
static void choose_cpu2(const char *path) {
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char head[3][512];
  for (int i = 0; i < 3; i++) ck_assert_ptr_nonnull(fgets(head[i], sizeof head[i], f));
  fclose(f);
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "%s%s%schosen 1\ncandidate 1 0 0 0 9.0\ncandidate 2 0 1 0 5.0\n", head[0], head[1],
          head[2]);
  fclose(f);
}

/* A model is restored on the places it trained on: a persistent model
 * whose choice was cpu:2 comes back on cpu:2 after a restart when its
 * evaluation program (which runs no trial) registers first, as pe-client
 * does when its first request after the restart names the model; the
 * training program joins it with the same strategy and the restored
 * values. drop-model removes the model's choice with its checkpoint. */
START_TEST(test_places_model_restart) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    fprintf(stderr, "places_model_restart: needs 2 cores, skipped\n");
    return;
  }
  dh_daemon d = {0};
  const char *conf = "[runtime]\nplaces_trial_steps = 2\n";
  start_auto(&d, conf);
  int s = dh_connect(&d, 60000);
  pe_model_spec mlp = dh_mlp();
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  Pe__Reply *rep = register_auto(s, &mlp, "warm", false);
  pe__reply__free_unpacked(rep, NULL);
  char file[1400];
  ck_assert_int_eq(choice_files(d.state, file, sizeof file), 1);
  choose_cpu2(file);
  char kept[1400];
  snprintf(kept, sizeof kept, "%s/models/warm/places.choice", d.state);
  ck_assert_msg(access(kept, F_OK) != 0, "%s written for a model that is not persistent", kept);

  rep = register_auto_as(s, &mlp, "pm", true, true);
  ck_assert_str_eq(rep->register_->places, "cpu:2");
  Pe__Strategy strategy = rep->register_->strategy;
  uint64_t h = rep->register_->handle;
  pe__reply__free_unpacked(rep, NULL);
  snprintf(kept, sizeof kept, "%s/models/pm/places.choice", d.state);
  ck_assert_msg(access(kept, R_OK) == 0, "%s not written", kept);
  dh_init_ok(s, CLIENT, h);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, STEPS);
  Pe__Reply *trained = dh_get_all(s, CLIENT, "pm");
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);

  /* The evaluation program first: the model's places, not the default. */
  start_auto(&d, conf);
  s = dh_connect(&d, 60000);
  dh_for_test = true;
  dh_places = NULL;
  dh_strategy = PE__STRATEGY__AUTO;
  rep = dh_register_call(s, CLIENT, &mlp, "pm", 3, true);
  dh_for_test = false;
  dh_ok(rep);
  ck_assert_msg(!strcmp(rep->register_->places, "cpu:2"),
                "model restored by its evaluation program on %s, trained on cpu:2",
                rep->register_->places);
  ck_assert_ptr_nonnull(rep->register_->places_trial);
  ck_assert(rep->register_->places_trial->remembered);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_log_has(&d, "as before its restart"));
  /* The training program joins it with the strategy it trained with. */
  rep = dh_register_call(s, CLIENT, &mlp, "pm", 3, true);
  dh_ok(rep);
  ck_assert_str_eq(rep->register_->places, "cpu:2");
  ck_assert_int_eq(rep->register_->strategy, strategy);
  pe__reply__free_unpacked(rep, NULL);
  Pe__Reply *restored = dh_get_all(s, CLIENT, "pm");
  const char *differs = dh_params_differ(trained, restored);
  ck_assert_msg(differs == NULL, "'%s' differs after the restart", differs);
  pe__reply__free_unpacked(restored, NULL);
  pe__reply__free_unpacked(trained, NULL);

  Pe__Request rq = dh_req(CLIENT);
  Pe__DropModelRequest dr = PE__DROP_MODEL_REQUEST__INIT;
  dr.model = (char *)"pm";
  rq.body_case = PE__REQUEST__BODY_DROP_MODEL;
  rq.drop_model = &dr;
  rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  char dir[1400];
  snprintf(dir, sizeof dir, "%s/models/pm", d.state);
  ck_assert_msg(access(dir, F_OK) != 0, "%s is left after drop-model", dir);

  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

/* places_trial = false: auto is cpu:1, no trial, nothing remembered; a
 * batch hint out of range is refused. */
START_TEST(test_places_trial_off) {
  dh_daemon d = {0};
  start_auto(&d, "[runtime]\nplaces_trial = false\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_strategy = PE__STRATEGY__AUTO;
  Pe__Reply *rep = dh_register_call(s, CLIENT, &mlp, "a", 3, false);
  dh_ok(rep);
  ck_assert_str_eq(rep->register_->places, "cpu:1");
  ck_assert(rep->register_->places_trial == NULL);
  pe__reply__free_unpacked(rep, NULL);
  char file[1400];
  ck_assert_int_eq(choice_files(d.state, file, sizeof file), 0);
  /* A batch hint out of range: refused, naming it and the range. */
  const int64_t bad[] = {-1, (int64_t)1 << 40};
  const char *why[] = {"options.batch_hint -1 is out of range (0..1048576)",
                       "options.batch_hint 1099511627776 is out of range"};
  for (int i = 0; i < 2; i++) {
    dh_batch_hint = bad[i];
    rep = dh_register_call(s, CLIENT, &mlp, "b", 3, false);
    dh_err(rep, PE_EINVAL, why[i]);
    pe__reply__free_unpacked(rep, NULL);
  }
  dh_batch_hint = 0;
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

/* Where [limits] memory_per_run holds less than two candidates' memory,
 * the trial holds one at a time and still times them all and chooses; the
 * model then trains. */
START_TEST(test_places_trial_groups) {
  dh_daemon d = {0};
  start_auto(&d, "[runtime]\nplaces_trial_steps = 2\n[limits]\nmemory_per_run = 4M\n");
  int s = dh_connect(&d, 60000);
  pe_model_spec mlp = dh_mlp();
  Pe__Reply *rep = register_auto(s, &mlp, "a", false);
  const Pe__PlacesTrial *t = rep->register_->places_trial;
  for (size_t i = 0; i < t->n_candidates; i++)
    ck_assert_msg(t->candidates[i]->step_ms > 0, "candidate %zu: %s", i, t->candidates[i]->error);
  ck_assert_msg(dh_log_has(&d, "(1 held at once)"), "no trial of one held at once (log %s)", d.log);
  ck_assert(!dh_log_has(&d, "(2 held at once)"));
  uint64_t h = rep->register_->handle;
  pe__reply__free_unpacked(rep, NULL);
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  dh_init_ok(s, CLIENT, h);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, STEPS);
  dh_batch_free(&b);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

/* One register of the places trial's pair (a thread each). */
typedef struct trial_reg {
  int sock;
  const pe_model_spec *mlp;
  const char *model;
  Pe__Reply *rep;
} trial_reg;

static void *register_thread(void *arg) {
  trial_reg *r = arg;
  r->rep = dh_register_call(r->sock, CLIENT, r->mlp, r->model, 3, false);
  return NULL;
}

/* Two registers of one program at once (two connections, two model
 * names): one runs the trial, the other waits for it and reads the
 * choice it remembered; the daemon times the candidates once. */
START_TEST(test_places_trials_one_at_a_time) {
  dh_daemon d = {0};
  start_auto(&d, "[runtime]\nplaces_trial_steps = 2\n");
  pe_model_spec mlp = dh_mlp();
  dh_places = NULL;
  dh_strategy = PE__STRATEGY__AUTO;
  dh_fuse = false;
  dh_batch_hint = 16;
  trial_reg r[2] = {{dh_connect(&d, 60000), &mlp, "a", NULL},
                    {dh_connect(&d, 60000), &mlp, "b", NULL}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    ck_assert_int_eq(pthread_create(&th[i], NULL, register_thread, &r[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  int timed = 0;
  for (int i = 0; i < 2; i++) {
    dh_ok(r[i].rep);
    const Pe__PlacesTrial *t = r[i].rep->register_->places_trial;
    ck_assert_ptr_nonnull(t);
    timed += !t->remembered;
  }
  ck_assert_int_eq(timed, 1);
  ck_assert_str_eq(r[0].rep->register_->places, r[1].rep->register_->places);
  for (int i = 0; i < 2; i++) {
    pe__reply__free_unpacked(r[i].rep, NULL);
    nn_close(r[i].sock);
  }
  dh_batch_hint = 0;
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

/* pe-client train --json reports the trial with the batch it trains with,
 * and pe-client status --json reports it for the model. */
START_TEST(test_places_trial_cli) {
  dh_daemon d = {0};
  start_auto(&d, "[runtime]\nplaces_trial_steps = 2\n");
  static char out[1 << 16];
  dh_cli(&d, "train --model mlp --epochs 1 --limit 200 --batch 50 --persistent --json", out,
         sizeof out);
  ck_assert_msg(strstr(out, "\"places_trial\":{\"places\":\"cpu:"), "%s", out);
  ck_assert_msg(strstr(out, "\"remembered\":false,\"batch\":50,"), "%s", out);
  ck_assert_msg(strstr(out, "\"candidates\":[{\"places\":\"cpu:1\""), "%s", out);
  dh_cli(&d, "status --json", out, sizeof out);
  ck_assert_msg(strstr(out, "\"name\":\"mlp\"") && strstr(out, "\"places_trial\":{"), "%s", out);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("places_trial");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_places_auto_trial);
  tcase_add_test(tc, test_places_model_restart);
  tcase_add_test(tc, test_places_trial_off);
  tcase_add_test(tc, test_places_trial_groups);
  tcase_add_test(tc, test_places_trials_one_at_a_time);
  tcase_add_test(tc, test_places_trial_cli);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
