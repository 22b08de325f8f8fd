/* pe-executord end to end: mutated requests (bit flips, truncations, random
 * bytes spliced into valid Register / Run / SetParams / Checkpoint
 * requests) each get a reply, and the daemon keeps serving a well-formed
 * client between them (a bad request fails alone). Deterministic (fixed
 * seed), a few hundred requests. */
#include <math.h>

#include "check_main.h"
#include "daemon_harness.h"

#define CLIENT 0x3003

static uint32_t rng_next(uint32_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 17;
  *x ^= *x << 5;
  return *x;
}

/* Mutations that would make the daemon train for minutes are skipped
 * (legal, but not what this test is about). */
static bool too_slow(const uint8_t *buf, size_t len) {
  Pe__Request *rq = pe__request__unpack(NULL, len, buf);
  if (!rq) return false;
  bool slow = rq->body_case == PE__REQUEST__BODY_RUN && rq->run->steps > 3;
  pe__request__free_unpacked(rq, NULL);
  return slow;
}

static uint8_t *pack(const Pe__Request *rq, size_t *len) {
  *len = pe__request__get_packed_size(rq);
  uint8_t *b = malloc(*len);
  pe__request__pack(rq, b);
  return b;
}

START_TEST(test_mutated_requests) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_register(s, CLIENT, &mlp, "good", 1, false, NULL, NULL);
  Pe__Reply *rep = dh_init(s, CLIENT, h);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  dh_batch b;
  dh_batch_make(&b, 4, 1);
  /* A reference model with the same seed gets the same good runs: the good
   * model must match it bit for bit, whatever the mutated requests did. */
  uint64_t href = dh_register(s, CLIENT, &mlp, "reference", 1, false, NULL, NULL);
  rep = dh_init(s, CLIENT, href);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  float first = dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  ck_assert(isfinite(first));
  ck_assert_float_eq(dh_run_loss(s, CLIENT, href, &b, mlp.loss, 1), first);

  /* Seeds: one valid request of each kind that carries structure. */
  size_t lens[4];
  uint8_t *seeds[4];
  Pe__Request rq = PE__REQUEST__INIT; /* ids 0: the seed is the body alone */
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  reg.program.data = mlp.bytes;
  reg.program.len = mlp.len;
  reg.model = (char *)"fuzz";
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = &reg;
  seeds[0] = pack(&rq, &lens[0]);
  /* Mutated runs go to a model of their own: garbage feeds (NaN images)
   * may legitimately ruin the model they train, never another one. */
  uint64_t hf = dh_register(s, CLIENT + 1, &mlp, "fuzzrun", 1, false, NULL, NULL);
  rep = dh_init(s, CLIENT + 1, hf);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  Pe__RunRequest run;
  char *fl[] = {mlp.loss};
  rq = dh_run_req(0, &run, hf, b.feeds, 2, fl, 1, 1);
  rq.request_id = 0;
  seeds[1] = pack(&rq, &lens[1]);
  rq = (Pe__Request)PE__REQUEST__INIT;
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  Pe__Tensor *vals[] = {&b.t_label};
  pr.model = (char *)"fuzz-params";
  pr.n_values = 1;
  pr.values = vals;
  rq.body_case = PE__REQUEST__BODY_SET_PARAMS;
  rq.set_params = &pr;
  seeds[2] = pack(&rq, &lens[2]);
  rq = (Pe__Request)PE__REQUEST__INIT;
  Pe__CheckpointRequest cr = PE__CHECKPOINT_REQUEST__INIT;
  cr.model = (char *)"good";
  cr.name = (char *)"fz";
  rq.body_case = PE__REQUEST__BODY_LOAD;
  rq.load = &cr;
  seeds[3] = pack(&rq, &lens[3]);

  uint32_t x = 0x9e3779b9u;
  int replies = 0, errors = 0, skipped = 0;
  for (int i = 0; i < 400; i++) {
    int k = i % 4;
    size_t len = lens[k];
    /* Fresh ids first (so no mutation is answered from the reply cache),
     * then the mutated body: protobuf merges the concatenation. */
    Pe__Request ids = PE__REQUEST__INIT;
    ids.client_id = CLIENT + 1;
    ids.request_id = 1000 + (uint64_t)i;
    size_t hl = pe__request__get_packed_size(&ids);
    uint8_t *msg = malloc(hl + len + 64);
    pe__request__pack(&ids, msg);
    uint8_t *m = msg + hl;
    memcpy(m, seeds[k], len);
    switch (rng_next(&x) % 4) {
      case 0: /* flip a few bits */
        for (int f = 0; f < 1 + (int)(rng_next(&x) % 4); f++)
          m[rng_next(&x) % len] ^= (uint8_t)(1u << (rng_next(&x) % 8));
        break;
      case 1: /* truncate */ len = rng_next(&x) % len; break;
      case 2: /* overwrite a run of bytes with random ones */
        for (size_t o = rng_next(&x) % len, e = o + 1 + rng_next(&x) % 16; o < e && o < len; o++)
          m[o] = (uint8_t)rng_next(&x);
        break;
      default: /* append random bytes */
        for (int a = 0; a < 1 + (int)(rng_next(&x) % 64); a++) m[len++] = (uint8_t)rng_next(&x);
        break;
    }
    len += hl;
    if (too_slow(msg, len)) {
      skipped++;
      free(msg);
      continue;
    }
    rep = dh_call_raw(s, msg, len);
    free(msg);
    ck_assert_msg(rep != NULL, "mutation %d: no reply (daemon alive: %d)", i, dh_alive(&d));
    replies++;
    errors += rep->code != 0;
    if (rep->code)
      ck_assert_msg(rep->message[0], "mutation %d: error %d without a message", i, rep->code);
    pe__reply__free_unpacked(rep, NULL);
    if (i % 40 == 39) {
      float l = dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
      float want = dh_run_loss(s, CLIENT, href, &b, mlp.loss, 1);
      ck_assert_msg(l == want, "mutation %d: the good model's loss is %g, the reference's %g", i, l,
                    want);
    }
  }
  ck_assert(dh_alive(&d));
  ck_assert_int_ge(replies, 350);
  ck_assert_int_ge(errors, 100); /* most mutations are caught as errors */
  fprintf(stderr, "fuzz: %d replies, %d errors, %d skipped\n", replies, errors, skipped);
  for (int k = 0; k < 4; k++) free(seeds[k]);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon_fuzz");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_mutated_requests);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
