/* pe-executord end to end: the size of one registered program is bounded
 * ([limits] max_program_ops and max_program_vars: a program over either is
 * refused before any compile pass, naming its count, the limit and the
 * key). */
#include "check_main.h"
#include "daemon_harness.h"
#include "program.pb-c.h"

#define CLIENT 0x11a1

/* Ops and variables of the program bytes of spec, all blocks. */
static void program_size(const pe_model_spec *spec, size_t *ops, size_t *vars) {
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, spec->len, spec->bytes);
  ck_assert(pd != NULL);
  *ops = *vars = 0;
  for (size_t b = 0; b < pd->n_blocks; b++) {
    *ops += pd->blocks[b]->n_ops;
    *vars += pd->blocks[b]->n_vars;
  }
  pe__program_desc__free_unpacked(pd, NULL);
}

/* The mlp is refused by a daemon whose limit `key` is one under its count
 * of `what`, and registers where the limit equals the count. */
static void limit_case(const char *key, const char *what) {
  pe_model_spec mlp = dh_mlp();
  size_t ops, vars;
  program_size(&mlp, &ops, &vars);
  size_t n = !strcmp(what, "ops") ? ops : vars;
  char conf[128], want[160];
  snprintf(conf, sizeof conf, "[limits]\n%s = %zu\n", key, n - 1);
  snprintf(want, sizeof want,
           "program (%zu bytes): ProgramDesc: %zu %s in its 2 block(s), over "
           "the limit [limits] %s = %zu",
           mlp.len, n, what, key, n - 1);
  dh_daemon d = {0};
  dh_start(&d, conf);
  int s = dh_connect(&d, 30000);
  Pe__Reply *rep = dh_register_call(s, CLIENT, &mlp, "m", 1, false);
  dh_err(rep, PE_EINVAL, want);
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);

  snprintf(conf, sizeof conf, "[limits]\n%s = %zu\n", key, n);
  dh_start(&d, conf);
  s = dh_connect(&d, 30000);
  dh_register(s, CLIENT, &mlp, "m", 1, false, NULL, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}

START_TEST(over_max_program_ops) {
  limit_case("max_program_ops", "ops");
}
END_TEST

START_TEST(over_max_program_vars) {
  limit_case("max_program_vars", "variables");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("program_limits");
  TCase *tc = tcase_create("limits");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, over_max_program_ops);
  tcase_add_test(tc, over_max_program_vars);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
