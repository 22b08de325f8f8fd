/* The parallel executor (parallel/executor.h) on small programs: one step on
 * cpu:1 equals the sequential executor, cpu:2 and sim:2 keep parameters
 * identical across places and follow the sequential loss, the startup graph
 * gives the sequential startup's parameters, a batch of 3 on 4 places gives
 * the 1-place update, a write-after-read hazard stays correct under random
 * delays, errors become the run's error and the executor stays usable, two
 * models run from two threads, and model get/set.
 *
 * Tolerances: a 1-place cpu run computes exactly the sequential program
 * (same kernels, same order): compared bitwise. Multi-place runs reduce over
 * each place's rows and then sum the places' gradients: a different
 * summation order, a few ulp per reduction; 1e-4 relative after a few steps
 * is ~100x what that gives and far below what a real bug gives (a missing
 * all-reduce or a wrong n_p/N scale moves the loss by > 1e-2). */
#include "check_main.h"
#include "par_test_util.h"

/* --- tests -------------------------------------------------------------------------- */

START_TEST(cpu1_equals_seq) {
  pe_runtime *rt = rt_new(2);
  seqref s;
  seq_new(&s, 5);
  par q;
  par_new(&q, rt, PE_PLACE_CPU, 1, PE_STRATEGY_ALLREDUCE, false, 5);
  copy_params(&s, &q);
  for (int step = 0; step < 3; step++) {
    float a = seq_step(&s, step, 12), b = par_step(&q, step, 12, NULL);
    ck_assert_msg(a == b, "step %d: seq loss %.9g, parallel %.9g", step, a, b);
  }
  ck_assert_msg(param_diff(&s, &q) == 0, "parameters differ: %g", param_diff(&s, &q));
  par_free(&q);
  seq_free(&s);
  pe_runtime_free(rt);
}
END_TEST

static void multi_place(pe_place_kind kind, int n, pe_graph_strategy strategy, bool fuse,
                        pe_sync_strategy sync, int batch) {
  pe_runtime *rt = rt_new(2);
  seqref s;
  seq_new(&s, 5);
  par q;
  par_new(&q, rt, kind, n, strategy, fuse, 5);
  copy_params(&s, &q);
  pe_run_opts ro = {.sync = sync};
  double worst = 0;
  for (int step = 0; step < 4; step++) {
    float a = seq_step(&s, step, batch), b = par_step(&q, step, batch, &ro);
    double d = fabs(a - b) / fabs(a);
    if (d > worst) worst = d;
    ck_assert_msg(d < RTOL, "%s:%d step %d: seq loss %.9g, parallel %.9g", pe_place_kind_name(kind),
                  n, step, a, b);
    assert_places_identical(&q);
  }
  double pd = param_diff(&s, &q);
  fprintf(
      stderr,
      "par_exec %s:%d strategy %d fuse %d sync %d batch %d: loss rdiff %.3g, param rdiff %.3g\n",
      pe_place_kind_name(kind), n, (int)strategy, (int)fuse, (int)sync, batch, worst, pd);
  ck_assert_msg(pd < RTOL, "parameters differ from seq by %g", pd);
  if (mlp_with_schedule) { /* 4 steps: the rate of step 3 is 0.1 * 0.5^1 */
    pe_tensor t;
    pe_tensor_init(&t);
    PE_CK_OK(pe_model_get(q.m, "learning_rate", &t));
    ck_assert_float_eq(pe_f32(&t)[0], 0.05f);
    PE_CK_OK(pe_model_get(q.m, "@LR_DECAY_COUNTER@", &t));
    ck_assert_int_eq(pe_i64(&t)[0], 4);
    pe_tensor_release(&t);
  }
  par_free(&q);
  seq_free(&s);
  pe_runtime_free(rt);
}

START_TEST(cpu2_allreduce) {
  multi_place(PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, PE_SYNC_WAIT_EVENT, 12);
}
END_TEST
START_TEST(cpu2_reduce_fused) {
  multi_place(PE_PLACE_CPU, 2, PE_STRATEGY_REDUCE, true, PE_SYNC_WAIT_EVENT, 11);
}
END_TEST
START_TEST(sim2_allreduce_event) {
  multi_place(PE_PLACE_SIM, 2, PE_STRATEGY_ALLREDUCE, false, PE_SYNC_WAIT_EVENT, 12);
}
END_TEST
START_TEST(sim2_fused_producer) {
  multi_place(PE_PLACE_SIM, 2, PE_STRATEGY_ALLREDUCE, true, PE_SYNC_WAIT_PRODUCER, 13);
}
END_TEST
START_TEST(sim3_reduce) {
  multi_place(PE_PLACE_SIM, 3, PE_STRATEGY_REDUCE, false, PE_SYNC_WAIT_EVENT, 10);
}
END_TEST
/* 3 samples on 4 places: place 3 gets none and contributes zero gradients. */
/* A learning-rate schedule under both strategies: every place runs the
 * lr_schedule op on its replica; under Reduce the owner's update reads its
 * own. The rate (compared with the sequential one by param_diff) and the
 * counter are the model's. */
START_TEST(schedule_every_strategy) {
  mlp_with_schedule = true;
  multi_place(PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, PE_SYNC_WAIT_EVENT, 12);
  multi_place(PE_PLACE_CPU, 2, PE_STRATEGY_REDUCE, true, PE_SYNC_WAIT_EVENT, 11);
  multi_place(PE_PLACE_SIM, 3, PE_STRATEGY_REDUCE, false, PE_SYNC_WAIT_PRODUCER, 10);
  mlp_with_schedule = false;
}
END_TEST

/* Gradient clipping by the global norm under AllReduce: every place clips
 * the summed gradients alike, so training follows the sequential run; the
 * fetched norm is the sequential one. Reduce and Sharded are refused (a
 * place lacks the other parameters' summed gradients), naming the op. */
START_TEST(clip_allreduce_only) {
  mlp_with_clip = true;
  multi_place(PE_PLACE_CPU, 2, PE_STRATEGY_ALLREDUCE, false, PE_SYNC_WAIT_EVENT, 12);
  multi_place(PE_PLACE_SIM, 3, PE_STRATEGY_ALLREDUCE, true, PE_SYNC_WAIT_PRODUCER, 10);
  /* 3 rows on 4 places: the place with none still clips the summed
   * gradients (the clip is not skipped as batch work). */
  multi_place(PE_PLACE_CPU, 4, PE_STRATEGY_ALLREDUCE, false, PE_SYNC_WAIT_EVENT, 3);
  multi_place(PE_PLACE_SIM, 4, PE_STRATEGY_ALLREDUCE, true, PE_SYNC_WAIT_EVENT, 3);
  pe_graph_strategy refused[] = {PE_STRATEGY_REDUCE, PE_STRATEGY_SHARDED};
  for (int i = 0; i < 2; i++) {
    pe_program *p = mlp_program();
    pe_pass_opts o = {.place_kind = PE_PLACE_CPU, .n_places = 2, .strategy = refused[i]};
    pe_ir ir = {p, NULL, NULL, &o};
    expect_errors(pe_graph_compile(&ir, false), PE_EINVAL, "clip_by_global_norm",
                  i ? "strategy sharded cannot" : "strategy reduce cannot", "use allreduce",
                  (const char *)NULL);
    pe_ir_destroy(&ir);
    pe_program_free(p);
  }
  /* A clip written in place on the gradients (a hand-made program) would
   * be all-reduced after clipping: refused on several places. */
  pe_program *p = mlp_program();
  pe_pass_opts o = {.place_kind = PE_PLACE_CPU, .n_places = 2};
  pe_ir ir = {p, NULL, NULL, &o};
  PE_CK_OK(pe_passes_run(&ir, "validate,backward,optimizer"));
  pe_block *m = pe_program_main(p);
  for (int i = 0; i < m->n_ops; i++) {
    pe_op_desc *op = m->ops[i];
    if (!strcmp(op->type, "clip_by_global_norm")) {
      pe_slot *x = pe_op_find_input(op, "X");
      PE_CK_OK(pe_op_set_output(op, "Out", x->n, (const char *const *)x->args));
    } else if (!strcmp(op->type, "momentum")) {
      char g[256];
      snprintf(g, sizeof g, "%s@GRAD", pe_op_input_arg(op, "Param"));
      PE_CK_OK(pe_op_input1(op, "Grad", g));
    }
  }
  expect_errors(pe_pass_run(&ir, "data_parallel"), PE_EINVAL, "clip_by_global_norm writes",
                "in place", (const char *)NULL);
  pe_ir_destroy(&ir);
  pe_program_free(p);
  mlp_with_clip = false;
}
END_TEST

START_TEST(uneven_3_on_4_cpu) {
  multi_place(PE_PLACE_CPU, 4, PE_STRATEGY_ALLREDUCE, false, PE_SYNC_WAIT_EVENT, 3);
}
END_TEST
START_TEST(uneven_3_on_4_sim) {
  multi_place(PE_PLACE_SIM, 4, PE_STRATEGY_REDUCE, true, PE_SYNC_WAIT_EVENT, 3);
}
END_TEST

/* The startup graph (init on place 0, broadcast) gives exactly the
 * sequential startup's values with the same seed, on every place. */
static void startup_equals_seq(pe_place_kind kind, int n) {
  pe_runtime *rt = rt_new(2);
  seqref s;
  seq_new(&s, 11);
  par q;
  par_new(&q, rt, kind, n, PE_STRATEGY_ALLREDUCE, false, 11);
  pe_run_stats st;
  PE_CK_OK(pe_par_exec_run(q.init, NULL, 0, NULL, 0, NULL, NULL, &st));
  ck_assert_int_gt(st.n_nodes, 0);
  assert_places_identical(&q);
  ck_assert_msg(param_diff(&s, &q) == 0, "startup differs from seq: %g", param_diff(&s, &q));
  /* and training from there follows seq */
  for (int step = 0; step < 2; step++) {
    float a = seq_step(&s, step, 9), b = par_step(&q, step, 9, NULL);
    ck_assert_msg(fabs(a - b) <= RTOL * fabs(a), "step %d: %.9g vs %.9g", step, a, b);
  }
  par_free(&q);
  seq_free(&s);
  pe_runtime_free(rt);
}

START_TEST(startup_cpu2) {
  startup_equals_seq(PE_PLACE_CPU, 2);
}
END_TEST
START_TEST(startup_sim3) {
  startup_equals_seq(PE_PLACE_SIM, 3);
}
END_TEST

static Suite *par_suite(void) {
  Suite *s = suite_create("par_exec");
  TCase *tc = tcase_create("par_exec");
  tcase_add_test(tc, cpu1_equals_seq);
  tcase_add_test(tc, cpu2_allreduce);
  tcase_add_test(tc, cpu2_reduce_fused);
  tcase_add_test(tc, sim2_allreduce_event);
  tcase_add_test(tc, sim2_fused_producer);
  tcase_add_test(tc, sim3_reduce);
  tcase_add_test(tc, schedule_every_strategy);
  tcase_add_test(tc, clip_allreduce_only);
  tcase_add_test(tc, uneven_3_on_4_cpu);
  tcase_add_test(tc, uneven_3_on_4_sim);
  tcase_add_test(tc, startup_cpu2);
  tcase_add_test(tc, startup_sim3);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(par_suite)
