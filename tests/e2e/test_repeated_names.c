/* pe-executord end to end: a request that names a variable twice is
 * refused, INVALID_ARGUMENT naming the variable and both entries, before
 * any value is copied: get_params names (each repeat copied the tensor
 * again: fc_0.w 4,000 times in a 32 KB request asked for 3 GB), run
 * fetches (each repeat copied every batch's value) and feeds, set_params
 * values and register's keep list. The daemon answers a ping afterwards.
 * Lists of more than a few names are checked with a hash set, so the
 * 4,000-name request is answered at once. */
#include "check_main.h"
#include "daemon_harness.h"

#define CLIENT 0x4e9e

/* A GetParams of model "m" naming names[0..n); the reply. */
static Pe__Reply *get_names(int s, char **names, size_t n) {
  Pe__Request rq = dh_req(CLIENT);
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  pr.model = "m";
  pr.n_names = n;
  pr.names = names;
  rq.body_case = PE__REQUEST__BODY_GET_PARAMS;
  rq.get_params = &pr;
  return dh_call(s, &rq);
}

START_TEST(get_params_repeated_name) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 60000);
  pe_model_spec mlp = dh_mlp();
  dh_setup_model(s, CLIENT, &mlp, "m", 1, false, NULL);
  /* Three names, the third repeats the first: compared pairwise. */
  char *three[] = {"fc_0.w", "fc_0.b", "fc_0.w"};
  Pe__Reply *rep = get_names(s, three, 3);
  dh_err(rep, PE_EINVAL, "get_params: name 'fc_0.w' is repeated (entries 0 and 2); give each once");
  pe__reply__free_unpacked(rep, NULL);
  /* 4,000 times the same name: the hash set's path. */
  enum { N = 4000 };
  char **many = malloc(N * sizeof *many);
  for (int i = 0; i < N; i++) many[i] = "fc_0.w";
  rep = get_names(s, many, N);
  dh_err(rep, PE_EINVAL, "get_params: name 'fc_0.w' is repeated (entries 0 and 1)");
  pe__reply__free_unpacked(rep, NULL);
  /* Twenty different names but for the last: found at its entry. */
  char *twenty[20] = {"fc_0.w", "fc_0.b"};
  char buf[18][16];
  for (int i = 2; i < 19; i++) {
    snprintf(buf[i - 2], sizeof buf[i - 2], "no_%d", i);
    twenty[i] = buf[i - 2];
  }
  twenty[19] = "fc_0.b";
  rep = get_names(s, twenty, 20);
  dh_err(rep, PE_EINVAL, "name 'fc_0.b' is repeated (entries 1 and 19)");
  pe__reply__free_unpacked(rep, NULL);
  /* Each name once: answered. */
  rep = get_names(s, three, 2);
  dh_ok(rep);
  ck_assert_int_eq((int)rep->params->n_values, 2);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_ping(s));
  free(many);
  nn_close(s);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

START_TEST(run_repeated_fetch_or_feed) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 60000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "m", 1, false, NULL);
  dh_batch b;
  dh_batch_make(&b, 8, 1);
  /* The loss twice, with 4 batches: every batch's loss would be copied
   * once per repeat. */
  Pe__RunRequest run;
  char *fetch[] = {mlp.loss, mlp.accuracy, mlp.loss};
  Pe__Request rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, fetch, 3, 0);
  run.batches = 4;
  Pe__Reply *rep = dh_call(s, &rq);
  char want[160];
  snprintf(want, sizeof want, "run: fetch '%s' is repeated (entries 0 and 2); give each once",
           mlp.loss);
  dh_err(rep, PE_EINVAL, want);
  ck_assert_int_ne(rep->body_case, PE__REPLY__BODY_RUN); /* no step ran */
  pe__reply__free_unpacked(rep, NULL);
  /* A feed twice. */
  Pe__Tensor *feeds[] = {b.feeds[0], b.feeds[1], b.feeds[0]};
  rq = dh_run_req(CLIENT, &run, h, feeds, 3, fetch, 1, 0);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "run: feed 'image' is repeated (entries 0 and 2)");
  pe__reply__free_unpacked(rep, NULL);
  /* Each once: runs. */
  rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, fetch, 2, 0);
  rep = dh_call(s, &rq);
  dh_ok(rep);
  ck_assert_int_eq((int)rep->run->n_fetched, 2);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_ping(s));
  dh_batch_free(&b);
  nn_close(s);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

START_TEST(set_params_and_keep_repeated) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 60000);
  pe_model_spec mlp = dh_mlp();
  dh_setup_model(s, CLIENT, &mlp, "m", 1, false, NULL);
  /* set_params: fc_0.b twice. */
  float v[256] = {0};
  int64_t shape[] = {256};
  Pe__Tensor t = PE__TENSOR__INIT;
  t.name = "fc_0.b";
  t.dtype = PE__DATA_TYPE__F32;
  t.n_shape = 1;
  t.shape = shape;
  t.data.data = (uint8_t *)v;
  t.data.len = sizeof v;
  Pe__Tensor *vals[] = {&t, &t};
  Pe__Request rq = dh_req(CLIENT);
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  pr.model = "m";
  pr.n_values = 2;
  pr.values = vals;
  rq.body_case = PE__REQUEST__BODY_SET_PARAMS;
  rq.set_params = &pr;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "set_params: value name 'fc_0.b' is repeated (entries 0 and 1)");
  pe__reply__free_unpacked(rep, NULL);
  /* register: keep lists the accuracy twice. */
  rq = dh_req(CLIENT);
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  Pe__RegisterOptions opts = PE__REGISTER_OPTIONS__INIT;
  char *keep[] = {mlp.accuracy, mlp.accuracy};
  opts.n_keep = 2;
  opts.keep = keep;
  reg.program.data = mlp.bytes;
  reg.program.len = mlp.len;
  reg.model = "k";
  reg.options = &opts;
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = &reg;
  rep = dh_call(s, &rq);
  char want[160];
  snprintf(want, sizeof want, "register: options.keep name '%s' is repeated (entries 0 and 1)",
           mlp.accuracy);
  dh_err(rep, PE_EINVAL, want);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_ping(s));
  nn_close(s);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("repeated_names");
  TCase *tc = tcase_create("names");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, get_params_repeated_name);
  tcase_add_test(tc, run_repeated_fetch_or_feed);
  tcase_add_test(tc, set_params_and_keep_repeated);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
