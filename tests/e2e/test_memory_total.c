/* pe-executord end to end, [limits] memory_total: the daemon's own memory
 * budget, on by default, that no set of clients can pass (client ids are
 * the clients' choice, so memory_per_client alone bounds nothing).
 *
 *  - defaults: a program with one tensor larger than the host (100 GiB or
 *    more), or the same bytes split over eight layers, is refused at
 *    register, before anything is allocated, naming the model, the
 *    largest variable, its shape and bytes, the budget and what is left;
 *  - a small budget: models of different client ids add up and the one
 *    that does not fit is refused; an eval program of a held model adds
 *    nothing; a deregister gives its model's bytes back; Status reports the
 *    budget and what is resident; a run whose temporaries do not fit
 *    beside the models is refused naming memory_total, a small one runs. */
#include "check_main.h"
#include "daemon_harness.h"
#include "pe_builder.h"

#define CLIENT 0x3e3a

/* x [-1, width], then `layers` fc layers of `width` outputs (weights
 * [width, width] f32), then a mean: an eval program. */
static void fc_program(int64_t width, int layers, uint8_t **bytes, size_t *len) {
  pe_builder *b = pe_builder_new();
  ck_assert_ptr_nonnull(b);
  int64_t dims[] = {-1, width};
  const char *x = pe_builder_data(b, "x", PE_B_F32, 2, dims);
  pe_b_fc_opts o = {.no_bias = true};
  for (int i = 0; i < layers && x; i++) x = pe_builder_fc(b, x, width, &o);
  ck_assert_msg(x && pe_builder_mean(b, x), "%s", pe_builder_error(b));
  ck_assert_msg(pe_builder_finish(b, bytes, len) == 0, "%s", pe_builder_error(b));
  pe_builder_free(b);
}

/* Defaults: a width whose one [w, w] f32 weight is at least 100 GiB and
 * twice the host's memory, refused whole or split over eight layers. */
START_TEST(test_huge_refused_by_default) {
  double host = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  double want = 2 * host > 100.0 * (1 << 30) ? 2 * host : 100.0 * (1 << 30);
  int64_t width = 1024;
  while ((double)width * (double)width * 4 < want) width += 1024;
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 60000);
  struct {
    int64_t width;
    int layers;
    const char *model;
  } cases[] = {{width, 1, "huge"}, {(int64_t)((double)width / 2.8), 8, "split"}};
  for (int c = 0; c < 2; c++) {
    uint8_t *bytes;
    size_t len;
    fc_program(cases[c].width, cases[c].layers, &bytes, &len);
    Pe__Reply *rep = dh_register_eval_call(s, CLIENT + (uint64_t)c, bytes, len, cases[c].model);
    char want_model[64], want_var[160];
    snprintf(want_model, sizeof want_model, "register: model '%s': %d new persistable(s)",
             cases[c].model, cases[c].layers);
    snprintf(want_var, sizeof want_var, "is f32 [%lld,%lld]: %lld bytes", (long long)cases[c].width,
             (long long)cases[c].width, (long long)(cases[c].width * cases[c].width * 4));
    dh_err(rep, PE_ENOMEM, want_model);
    dh_err(rep, PE_ENOMEM, want_var);
    dh_err(rep, PE_ENOMEM, "do not fit the daemon's memory budget [limits] memory_total = ");
    dh_err(rep, PE_ENOMEM, " are left (0 resident");
    pe__reply__free_unpacked(rep, NULL);
    free(bytes);
  }
  /* Refused before any of it was allocated. */
  ck_assert_int_lt(dh_rss_kb(&d), 2048 * 1024);
  ck_assert(dh_ping(s));
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

typedef struct budget_status {
  uint64_t total, resident;
} budget_status;

static budget_status status_budget(int s) {
  Pe__Request rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  budget_status b = {rep->status->memory_total_bytes, rep->status->memory_resident_bytes};
  pe__reply__free_unpacked(rep, NULL);
  return b;
}

/* The MLP training program's persistables (parameters, momentum state,
 * learning rate: about 1.9 MB) against a budget of 5 MiB: two models fit,
 * a third one of a third client id does not, whatever id sends it. */
START_TEST(test_clients_share_one_budget) {
  dh_daemon d = {0};
  dh_start(&d, "[limits]\nmemory_total = 5M\n");
  int s = dh_connect(&d, 60000);
  pe_model_spec mlp = dh_mlp();
  ck_assert_uint_eq(status_budget(s).total, 5u << 20);
  ck_assert_uint_eq(status_budget(s).resident, 0);
  uint64_t h1 = dh_register(s, CLIENT + 1, &mlp, "m1", 1, false, NULL, NULL);
  uint64_t one = status_budget(s).resident;
  ck_assert_uint_gt(one, 1u << 20);
  uint64_t h2 = dh_register(s, CLIENT + 2, &mlp, "m2", 1, false, NULL, NULL);
  ck_assert_uint_eq(status_budget(s).resident, 2 * one);
  Pe__Reply *rep = dh_register_call(s, CLIENT + 3, &mlp, "m3", 1, false);
  dh_err(rep, PE_ENOMEM, "register: model 'm3': ");
  dh_err(rep, PE_ENOMEM, "memory_total = 5242880 bytes");
  dh_err(rep, PE_ENOMEM, "; the largest, '");
  pe__reply__free_unpacked(rep, NULL);
  ck_assert_uint_eq(status_budget(s).resident, 2 * one); /* the refusal holds nothing */
  /* An eval program of m1 declares nothing new. */
  dh_for_test = true;
  dh_register(s, CLIENT + 4, &mlp, "m1", 1, false, NULL, NULL);
  dh_for_test = false;
  ck_assert_uint_eq(status_budget(s).resident, 2 * one);

  /* A run must fit beside the models: 5 MiB less two models leaves about
   * 1.2 MB, under the temporaries of 1024 rows, over those of 8. */
  ck_assert(dh_init_ok(s, CLIENT + 1, h1));
  dh_batch big, small;
  dh_batch_make(&big, 1024, 3);
  dh_batch_make(&small, 8, 3);
  rep = dh_run_batches(s, CLIENT + 1, h1, &big, mlp.loss, 0);
  dh_err(rep, PE_ENOMEM, "run: a batch of 1024 rows needs ");
  dh_err(rep, PE_ENOMEM, "more than the daemon's memory budget [limits] memory_total = 5242880");
  pe__reply__free_unpacked(rep, NULL);
  float loss = dh_run_loss(s, CLIENT + 1, h1, &small, mlp.loss, 1);
  ck_assert(loss > 0 && loss < 10);
  dh_batch_free(&big);
  dh_batch_free(&small);

  /* m2's deregister frees it, and its bytes: m3 fits now. */
  dh_deregister(s, CLIENT + 2, h2);
  ck_assert_uint_ne(dh_register(s, CLIENT + 3, &mlp, "m3", 1, false, NULL, NULL), 0);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("memory_total");
  TCase *tc = tcase_create("e2e");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_huge_refused_by_default);
  tcase_add_test(tc, test_clients_share_one_budget);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
