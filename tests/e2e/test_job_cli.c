/* pe-client train --job, end to end on loopback: two daemons, one
 * pe-client train on each (rank 0 and rank 1 of one job), each with
 * --batch B on cpu:1, against one daemon training the same data with
 * --batch 2B on cpu:2, same seed and epochs. Every epoch's order is made
 * on every node as one machine makes it, and each node walks every
 * world-th position of it (pe_batcher_shard), so step s of the job holds
 * the examples of the one machine's step s: the two nodes end
 * bit-identical, and equal to the one machine within summation order
 * (the places and the nodes sum in another order). With each node
 * shuffling a shard of its own, the job would train on other batches. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_cli.h"
#include "client_daemon.h"
#include "free_port.h"
#include "pe_client.h"
#include "test_assert.h"

#define CONF "[job]\nhost = 127.0.0.1\ntimeout = 30\n"
/* 300 examples: 150 a node, 6 steps of 25 an epoch. */
#define COMMON "train --model mlp --epochs 2 --limit 300 --seed 3 --persistent --quiet --json"

/* Every value of model mlp on d, concatenated in name order. */
static float *params_of(const cd_daemon *d, size_t *n) {
  pe_client *c = cd_connect(d);
  const pe_client_tensor *v;
  size_t k;
  CD_OK(c, pe_client_get_params(c, "mlp", NULL, 0, &v, &k));
  size_t total = 0;
  for (size_t i = 0; i < k; i++) total += v[i].nbytes;
  float *out = malloc(total);
  size_t at = 0;
  for (size_t i = 0; i < k; i++) {
    memcpy((char *)out + at, v[i].data, v[i].nbytes);
    at += v[i].nbytes;
  }
  *n = total / sizeof(float);
  pe_client_close(c);
  pe_client_free(c);
  return out;
}

START_TEST(job_trains_as_one_machine_on_the_global_batch) {
  cd_daemon d[2], one;
  int port = free_port();
  setenv("PE_JOB_TOKEN", "secret", 1);
  for (int r = 0; r < 2; r++) cd_start_conf(&d[r], CONF);
  pid_t pid[2];
  for (int r = 0; r < 2; r++) {
    char args[512];
    snprintf(args, sizeof args,
             COMMON
             " --batch 25 --places cpu:1 --job j --world 2 --rank %d "
             "--rendezvous 127.0.0.1:%d",
             r, port);
    pid[r] = cli_start(&d[r], d[r].dir, args);
  }
  for (int r = 0; r < 2; r++) {
    int rc = cli_wait(pid[r]);
    if (rc) cd_dump_log(&d[r]);
    ck_assert_msg(rc == 0, "rank %d: pe-client exited %d: %s", r, rc, slurp(d[r].dir, "err"));
    const char *out = slurp(d[r].dir, "out");
    ck_assert_msg(json_num(out, "steps") == 12, "rank %d: %s", r, out);
  }
  cd_start(&one);
  int rc = cli(&one, one.dir, COMMON " --batch 50 --places cpu:2 --strategy allreduce");
  ck_assert_msg(rc == 0, "one machine: pe-client exited %d: %s", rc, slurp(one.dir, "err"));

  size_t n0, n1, nr;
  float *p0 = params_of(&d[0], &n0), *p1 = params_of(&d[1], &n1), *ref = params_of(&one, &nr);
  ck_assert_uint_eq(n0, n1);
  ck_assert_uint_eq(n0, nr);
  ck_assert_msg(!memcmp(p0, p1, n0 * sizeof(float)), "the nodes' parameters differ");
  double worst = 0;
  for (size_t i = 0; i < n0; i++) {
    double dv = fabs((double)p0[i] - (double)ref[i]);
    if (dv > worst) worst = dv;
  }
  ck_assert_msg(worst <= 1e-5, "the job is %g from one machine on the global batch", worst);
  free(p0);
  free(p1);
  free(ref);
  for (int r = 0; r < 2; r++) cd_stop(&d[r]);
  cd_stop(&one);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("job_cli");
  TCase *tc = tcase_create("job_cli");
  tcase_add_test(tc, job_trains_as_one_machine_on_the_global_batch);
  suite_add_tcase(s, tc);
  return s;
}

CD_CHECK_MAIN(suite)
