/* pe-executord end to end, basics: ping/status, register (same handle
 * twice), init (once), run returns the loss, bad input of every kind gets
 * its own error while the daemon keeps serving, two places, places that
 * cannot be opened, and sd_notify. Register's optimizer override is
 * test_daemon_basic_optimizer.c, the [limits] test_daemon_basic_limits.c. */
#include <math.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "check_main.h"
#include "daemon_basic.h"
#include "engine/device.h"
#include "ir/program.h"
#include "test_assert.h"

START_TEST(test_ping_status) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 5000);
  ck_assert(dh_ping(s));
  Pe__Request rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_STATUS);
  ck_assert_str_eq(rep->status->version, "0.1.0");
  ck_assert_int_eq((int)rep->status->n_places, 1);
  ck_assert_str_eq(rep->status->places[0]->place, "cpu:0");
  ck_assert_int_eq(rep->status->programs, 0);
  /* Idle: the Status itself is not counted. */
  ck_assert_int_eq(rep->status->queue_depth, 0);
  ck_assert_int_eq(rep->status->runs_in_flight, 0);
  /* Nor a request whose reply came back (one taken from the socket counts
   * until its reply leaves, not until its thread has tidied up). */
  for (int i = 0; i < 2000; i++) {
    ck_assert(dh_ping(s));
    Pe__Reply *r = dh_call(s, &rq);
    ck_assert_msg(r->status->queue_depth == 0, "after %d pings: queue depth %d", i + 1,
                  r->status->queue_depth);
    pe__reply__free_unpacked(r, NULL);
    rq.request_id = dh_req(CLIENT).request_id;
  }
  /* The readiness pings and the ping above were counted. */
  ck_assert_uint_ge(rep->status->requests_total, 2);
  ck_assert_double_ge(rep->status->uptime_s, 0.0);
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

START_TEST(test_register_init_run) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  bool existed = true;
  Pe__Reply *reg = NULL;
  uint64_t h1 = dh_register(s, CLIENT, &mlp, "m1", 7, false, &existed, &reg);
  ck_assert(!existed);
  ck_assert_uint_ne(h1, 0);
  /* 784-256-128-10: three weights and three biases at least. */
  ck_assert_uint_ge(reg->register_->n_params, 6);
  char *w = dh_first_weight(reg);
  pe__reply__free_unpacked(reg, NULL);
  uint64_t h2 = dh_register(s, CLIENT, &mlp, "m1", 7, false, &existed, NULL);
  ck_assert_uint_eq(h1, h2);
  ck_assert(existed);
  /* Other options are another program. */
  uint64_t h3 = dh_register(s, CLIENT, &mlp, "m1", 8, false, &existed, NULL);
  ck_assert_uint_ne(h1, h3);

  Pe__Reply *rep = dh_init(s, CLIENT, h1);
  dh_ok(rep);
  ck_assert(rep->init->initialized);
  pe__reply__free_unpacked(rep, NULL);
  size_t n0;
  uint8_t *w0 = dh_get_param(s, CLIENT, "m1", w, &n0);
  rep = dh_init(s, CLIENT, h1);
  dh_ok(rep);
  ck_assert(!rep->init->initialized); /* parameters exist: nothing done */
  pe__reply__free_unpacked(rep, NULL);
  size_t n1;
  uint8_t *w1 = dh_get_param(s, CLIENT, "m1", w, &n1);
  ck_assert_uint_eq(n0, n1);
  ck_assert_msg(memcmp(w0, w1, n0) == 0, "second init changed %s", w);

  dh_batch b;
  dh_batch_make(&b, 16, 1);
  float loss = dh_run_loss(s, CLIENT, h1, &b, mlp.loss, 1);
  /* Fresh softmax over 10 classes: about ln 10. */
  ck_assert_msg(isfinite(loss) && loss > 1.5f && loss < 3.5f, "initial loss %g", loss);
  float loss5 = dh_run_loss(s, CLIENT, h1, &b, mlp.loss, 5);
  ck_assert_msg(loss5 < loss, "loss after 5 more steps on one batch %g, first %g", loss5, loss);
  size_t n2;
  uint8_t *w2 = dh_get_param(s, CLIENT, "m1", w, &n2);
  ck_assert_msg(memcmp(w0, w2, n0) != 0, "training did not change %s", w);

  /* Trace: a Chrome trace of the run comes back; timings are filled. */
  Pe__RunRequest run;
  Pe__RunOptions ro = PE__RUN_OPTIONS__INIT;
  char *fetch2[] = {mlp.loss, mlp.accuracy};
  Pe__Request rq = dh_run_req(CLIENT, &run, h1, b.feeds, 2, fetch2, 2, 2);
  ro.trace = 1;
  run.options = &ro;
  Pe__Reply *tr = dh_call(s, &rq);
  dh_ok(tr);
  ck_assert_uint_eq(tr->run->steps, 2);
  ck_assert_int_eq((int)tr->run->n_fetched, 2);
  ck_assert_str_eq(tr->run->fetched[1]->name, mlp.accuracy);
  ck_assert_double_gt(tr->run->run_ms, 0.0);
  ck_assert_double_ge(tr->run->queue_ms, 0.0);
  ck_assert_uint_gt(tr->run->trace_json.len, 100);
  char *json = strndup((const char *)tr->run->trace_json.data, tr->run->trace_json.len);
  ck_assert_msg(strstr(json, "traceEvents") && strstr(json, "cpu:0"), "%.200s", json);
  free(json);
  pe__reply__free_unpacked(tr, NULL);
  /* Timeout: checked between steps, DEADLINE_EXCEEDED (not IO_ERROR: no
   * disk or socket failed); the steps applied are named and, in the error
   * reply's RunReply, counted, for steps and for batches. */
  Pe__RunOptions to = PE__RUN_OPTIONS__INIT;
  to.timeout_ms = 1;
  dh_batch many;
  dh_batch_make(&many, 2000, 4);
  for (int batched = 0; batched < 2; batched++) {
    rq = dh_run_req(CLIENT, &run, h1, batched ? many.feeds : b.feeds, 2, fetch2, 1,
                    batched ? 0 : 100000);
    run.batches = batched ? 2000 : 0;
    run.options = &to;
    tr = dh_call(s, &rq);
    dh_err(tr, PE_EDEADLINE, "timeout of 1 ms");
    unsigned applied = 0, of = 0;
    const char *after = strstr(tr->message, "reached after ");
    ck_assert_msg(after && sscanf(after, "reached after %u of %u steps", &applied, &of) == 2 &&
                      of == (batched ? 2000u : 100000u) && applied > 0,
                  "%s", tr->message);
    ck_assert_msg(tr->body_case == PE__REPLY__BODY_RUN && tr->run->steps == applied &&
                      tr->run->n_fetched == 0,
                  "batched %d: body %d, steps %u, message: %s", batched, (int)tr->body_case,
                  tr->body_case == PE__REPLY__BODY_RUN ? tr->run->steps : 0, tr->message);
    pe__reply__free_unpacked(tr, NULL);
  }
  dh_batch_free(&many);

  free(w0);
  free(w1);
  free(w2);
  free(w);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

START_TEST(test_bad_requests) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_register(s, CLIENT, &mlp, "m1", 1, false, NULL, NULL);
  Pe__Reply *rep = dh_init(s, CLIENT, h);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  dh_batch b;
  dh_batch_make(&b, 8, 2);

  /* Garbage bytes. */
  const char garbage[] = "\xff\xff\xff\xff garbage, not a protobuf \x01\x02";
  rep = dh_call_raw(s, garbage, sizeof garbage);
  ck_assert(rep != NULL);
  dh_err(rep, PE_EINVAL, "malformed request");
  pe__reply__free_unpacked(rep, NULL);

  /* A truncated Run request. */
  Pe__RunRequest run;
  char *fl[] = {mlp.loss};
  Pe__Request rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, fl, 1, 1);
  size_t len = pe__request__get_packed_size(&rq);
  uint8_t *buf = malloc(len);
  pe__request__pack(&rq, buf);
  rep = dh_call_raw(s, buf, len / 2);
  ck_assert(rep != NULL);
  dh_err(rep, PE_EINVAL, "malformed request");
  pe__reply__free_unpacked(rep, NULL);
  free(buf);

  /* No body. */
  rq = dh_req(CLIENT);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "no request body");
  pe__reply__free_unpacked(rep, NULL);

  /* Unknown handle. */
  rq = dh_run_req(CLIENT, &run, 0xdeadbeef, b.feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ENOTFOUND, "00000000deadbeef");
  pe__reply__free_unpacked(rep, NULL);

  /* Missing feed: label. */
  rq = dh_run_req(CLIENT, &run, h, b.feeds, 1, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EMISSING_FEED, "label");
  pe__reply__free_unpacked(rep, NULL);

  /* Unknown feed name. */
  Pe__Tensor bogus = b.t_label;
  bogus.name = (char *)"lable";
  Pe__Tensor *feeds3[] = {&b.t_image, &bogus};
  rq = dh_run_req(CLIENT, &run, h, feeds3, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EUNKNOWN_VAR, "lable");
  pe__reply__free_unpacked(rep, NULL);

  /* Shape mismatch: image [8, 700]. */
  Pe__Tensor img = b.t_image;
  int64_t bad_shape[] = {8, 700};
  img.shape = bad_shape;
  img.data.len = 8 * 700 * 4;
  Pe__Tensor *feeds4[] = {&img, &b.t_label};
  rq = dh_run_req(CLIENT, &run, h, feeds4, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ESHAPE, "[8,700]");
  ck_assert_msg(strstr(rep->message, "image") && strstr(rep->message, "784"), "%s", rep->message);
  pe__reply__free_unpacked(rep, NULL);

  /* Bytes that do not match the shape. */
  img = b.t_image;
  img.data.len -= 4;
  rq = dh_run_req(CLIENT, &run, h, feeds4, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ESHAPE, "image");
  pe__reply__free_unpacked(rep, NULL);

  /* Wrong dtype: label as f32. */
  Pe__Tensor lab = b.t_label;
  lab.dtype = PE__DATA_TYPE__F64; /* same byte count as i64 */
  Pe__Tensor *feeds5[] = {&b.t_image, &lab};
  rq = dh_run_req(CLIENT, &run, h, feeds5, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EDTYPE, "label");
  pe__reply__free_unpacked(rep, NULL);

  /* Out-of-range dtype enum (protobuf-c does not check enums). */
  lab.dtype = (Pe__DataType)77;
  rq = dh_run_req(CLIENT, &run, h, feeds5, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EDTYPE, "dtype 77");
  pe__reply__free_unpacked(rep, NULL);

  /* Unknown fetch. */
  char *bad_fetch[] = {(char *)"no_such_var"};
  rq = dh_run_req(CLIENT, &run, h, b.feeds, 2, bad_fetch, 1, 1);
  rep = dh_call(s, &rq);
  ck_assert_int_ne(rep->code, 0);
  ck_assert_msg(strstr(rep->message, "no_such_var"), "%s", rep->message);
  pe__reply__free_unpacked(rep, NULL);

  /* A program that is not a ProgramDesc. */
  rq = dh_req(CLIENT);
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  reg.program.data = (uint8_t *)garbage;
  reg.program.len = sizeof garbage;
  reg.model = (char *)"m2";
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = &reg;
  rep = dh_call(s, &rq);
  ck_assert_int_ne(rep->code, 0);
  ck_assert_msg(strstr(rep->message, "register"), "%s", rep->message);
  pe__reply__free_unpacked(rep, NULL);
  /* A bad model name. */
  reg.program.data = mlp.bytes;
  reg.program.len = mlp.len;
  reg.model = (char *)"../evil";
  rq = dh_req(CLIENT); /* a new id: the old one would get the cached reply */
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = &reg;
  rep = dh_call(s, &rq);
  dh_err(rep, PE_EINVAL, "model name");
  pe__reply__free_unpacked(rep, NULL);

  /* options.keep naming a variable the program does not have: refused,
   * named (it was accepted silently, and a fetch of it failed later). */
  {
    Pe__RegisterOptions ko = PE__REGISTER_OPTIONS__INIT;
    char *keep[] = {mlp.accuracy, (char *)"nope"};
    ko.n_keep = 2;
    ko.keep = keep;
    reg.options = &ko;
    reg.model = (char *)"kept";
    register_fails(s, &reg, PE_EUNKNOWN_VAR,
                   "keep: 'nope' is not a variable of the program's graph");
    reg.options = NULL;
  }

  /* options.cuda_graph outside auto, on, off: refused, named. */
  {
    Pe__RegisterOptions co = PE__REGISTER_OPTIONS__INIT;
    co.cuda_graph = (char *)"yes";
    reg.options = &co;
    reg.model = (char *)"graphs";
    register_fails(s, &reg, PE_EINVAL, "options.cuda_graph 'yes' unknown (auto, on, off)");
    reg.options = NULL;
  }

  /* A program with a cycle: an op reading what only it writes. */
  {
    pe_program *cyc = pe_program_new();
    pe_block *blk;
    PE_CK_OK(pe_program_add_block(cyc, -1, &blk));
    pe_shape sh = PE_SHAPE(2, 2);
    PE_CK_OK(pe_block_add_var(blk, "self", PE_F32, &sh, NULL));
    pe_op_desc *op;
    PE_CK_OK(pe_block_append_op(blk, "relu", &op));
    PE_CK_OK(pe_op_input1(op, "X", "self"));
    PE_CK_OK(pe_op_output1(op, "Out", "self"));
    uint8_t *cb;
    size_t cl;
    PE_CK_OK(pe_program_encode(cyc, &cb, &cl));
    pe_program_free(cyc);
    reg.program.data = cb;
    reg.program.len = cl;
    reg.model = (char *)"cyclic";
    rq = dh_req(CLIENT);
    rq.body_case = PE__REQUEST__BODY_REGISTER;
    rq.register_ = &reg;
    rep = dh_call(s, &rq);
    dh_err(rep, PE_ECYCLE, "'self'");
    pe__reply__free_unpacked(rep, NULL);
    free(cb);
  }

  /* RegisterShm sizes: 0, and one too large to map (2^63, which must not be
   * told "must be > 0"). Checked before the name is opened. */
  {
    Pe__ShmRequest sr = PE__SHM_REQUEST__INIT;
    sr.name = (char *)"/pe-test-no-such-region";
    const uint64_t sizes[] = {0, UINT64_C(1) << 63};
    const char *want[] = {"size 0: it must be > 0", "size 9223372036854775808 is too large"};
    for (int i = 0; i < 2; i++) {
      sr.size = sizes[i];
      rq = dh_req(CLIENT);
      rq.body_case = PE__REQUEST__BODY_REGISTER_SHM;
      rq.register_shm = &sr;
      rep = dh_call(s, &rq);
      dh_err(rep, PE_EINVAL, want[i]);
      pe__reply__free_unpacked(rep, NULL);
    }
  }

  /* After all that, the model still trains. */
  float loss = dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  ck_assert_msg(isfinite(loss) && loss > 0, "loss %g", loss);
  ck_assert(dh_alive(&d));

  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* A model on cpu:2 (data parallel) gives the cpu:1 losses: the batch is
 * split, the gradients all-reduced, the loss weighted by each share. */
/* A configured device that cannot be opened stops start-up with the
 * reason, before the daemon says it is ready: here cuda:1 on a machine
 * without a GPU (on one with a GPU, cuda:1 opens and there is nothing to
 * check). */
START_TEST(test_start_refuses_unusable_places) {
  if (access("/dev/nvidia0", F_OK) == 0) {
    printf("a GPU is present: cuda:1 opens, nothing to refuse\n");
    return;
  }
  dh_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "/tmp/pe-e2e-XXXXXX");
  ck_assert(mkdtemp(d.dir) != NULL);
  char cmd[1024], out[2048] = "";
  snprintf(cmd, sizeof cmd,
           "'%s/pe-executord' --places cuda:1 --socket 'ipc://%s/d.sock' --state-dir '%s/state' "
           "2>&1",
           getenv("PE_BUILD_DIR"), d.dir, d.dir);
  FILE *f = popen(cmd, "r");
  ck_assert(f != NULL);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = 0;
  int st = pclose(f);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x, output: %s", st, out);
  ck_assert_msg(strstr(out, "config [runtime] places 'cuda:1'") && strstr(out, "cuda") &&
                    !strstr(out, "ready on"),
                "output: %s", out);
  if (pe_device_kind_ops(PE_PLACE_CUDA))
    ck_assert_msg(strstr(out, "device cuda:0"), "output: %s", out);
  dh_cleanup(&d);
}
END_TEST

START_TEST(test_two_places) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h1 = dh_register(s, CLIENT, &mlp, "one", 5, false, NULL, NULL);
  dh_places = "cpu:2";
  uint64_t h2 = dh_register(s, CLIENT, &mlp, "two", 5, false, NULL, NULL);
  dh_strategy = PE__STRATEGY__SHARDED;
  uint64_t h3 = dh_register(s, CLIENT, &mlp, "three", 5, false, NULL, NULL);
  dh_strategy = PE__STRATEGY__ALLREDUCE;
  /* One model name lives on one set of places. */
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  Pe__RegisterOptions opts = PE__REGISTER_OPTIONS__INIT;
  opts.places = (char *)"cpu:2";
  reg.program.data = mlp.bytes;
  reg.program.len = mlp.len;
  reg.model = (char *)"one";
  reg.options = &opts;
  register_fails(s, &reg, PE_EINVAL, "lives on cpu:1");
  /* An unknown strategy is refused by name. */
  reg.model = (char *)"four";
  opts.strategy = (Pe__Strategy)7;
  register_fails(s, &reg, PE_EINVAL,
                 "options.strategy 7 unknown (0 allreduce, 1 reduce, 2 sharded, 3 auto)");
  /* cuda places that cannot be opened (no GPU here) are refused with the
   * reason; the daemon answers on (below). */
  if (access("/dev/nvidia0", F_OK) != 0) {
    reg.model = (char *)"five";
    opts.strategy = PE__STRATEGY__ALLREDUCE;
    opts.places = (char *)"cuda:2";
    register_fails(s, &reg, pe_device_kind_ops(PE_PLACE_CUDA) ? PE_EBACKEND : PE_EINVAL, "cuda");
  }
  dh_places = NULL;
  Pe__Reply *rep;
  rep = dh_init(s, CLIENT, h1);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  rep = dh_init(s, CLIENT, h2);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  rep = dh_init(s, CLIENT, h3);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  /* Status lists every place a model lives on: cpu:0 holds both models'
   * parameters, cpu:1 only the replica of the cpu:2 model. */
  Pe__Request rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  rep = dh_call(s, &rq);
  dh_ok(rep);
  ck_assert_int_eq((int)rep->status->n_places, 2);
  ck_assert_str_eq(rep->status->places[1]->place, "cpu:1");
  ck_assert_int_gt(rep->status->places[1]->bytes_in_use, 0);
  /* cpu:0: one + two + three; cpu:1: two + three (sharded keeps full
   * replicas of the parameters and optimizer state too). */
  ck_assert_int_eq(2 * rep->status->places[0]->bytes_in_use,
                   3 * rep->status->places[1]->bytes_in_use);
  pe__reply__free_unpacked(rep, NULL);
  dh_batch b;
  dh_batch_make(&b, 16, 5);
  for (int step = 0; step < 3; step++) {
    float l1 = dh_run_loss(s, CLIENT, h1, &b, mlp.loss, 1);
    float l2 = dh_run_loss(s, CLIENT, h2, &b, mlp.loss, 1);
    float l3 = dh_run_loss(s, CLIENT, h3, &b, mlp.loss, 1);
    ck_assert_msg(fabsf(l1 - l2) <= 1e-4f * fmaxf(1.0f, fabsf(l1)),
                  "step %d: cpu:1 %.7g, cpu:2 %.7g", step, l1, l2);
    /* Sharded sums and updates in the all-reduce's order: bitwise equal. */
    ck_assert_msg(memcmp(&l2, &l3, sizeof l2) == 0, "step %d: cpu:2 allreduce %.9g, sharded %.9g",
                  step, l2, l3);
  }
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* The next datagram on the notify socket that has `tag` (3 s), or fails. */
static void recv_tag(int ns, const char *tag, char *buf, size_t cap) {
  double t0 = dh_now();
  while (dh_now() - t0 < 3) {
    ssize_t n = recv(ns, buf, cap - 1, 0);
    if (n <= 0) continue;
    buf[n] = 0;
    if (strstr(buf, tag)) return;
  }
  ck_abort_msg("no %s on the notify socket within 3 s", tag);
}

/* sd_notify: READY=1 once serving, WATCHDOG=1 at WATCHDOG_USEC/2, STATUS=,
 * RELOADING=1 (with MONOTONIC_USEC= from after the signal) then READY=1 on
 * SIGHUP (systemctl reload waits for them), and STOPPING=1 on SIGTERM;
 * through a fake NOTIFY_SOCKET. */
START_TEST(test_sd_notify) {
  dh_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "/tmp/pe-e2e-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(d.dir));
  snprintf(d.notify, sizeof d.notify, "%s/notify", d.dir);
  int ns = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(ns, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  ck_assert_uint_lt(strlen(d.notify), sizeof sa.sun_path);
  memcpy(sa.sun_path, d.notify, strlen(d.notify) + 1);
  ck_assert_int_eq(bind(ns, (struct sockaddr *)&sa, sizeof sa), 0);
  struct timeval tv = {0, 100000};
  setsockopt(ns, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  dh_start(&d, "[sessions]\nttl = 600\n");
  bool ready = false, status = false;
  int watchdogs = 0;
  double t0 = dh_now();
  while (dh_now() - t0 < 3 && !(ready && status && watchdogs >= 2)) {
    char buf[512];
    ssize_t n = recv(ns, buf, sizeof buf - 1, 0);
    if (n <= 0) continue;
    buf[n] = 0;
    ready |= strstr(buf, "READY=1") != NULL;
    status |= strstr(buf, "STATUS=") != NULL;
    watchdogs += strstr(buf, "WATCHDOG=1") != NULL;
  }
  ck_assert_msg(ready && status && watchdogs >= 2, "ready %d status %d watchdogs %d", ready, status,
                watchdogs);
  struct timespec hup;
  clock_gettime(CLOCK_MONOTONIC, &hup);
  kill(d.pid, SIGHUP);
  char buf[512];
  recv_tag(ns, "RELOADING=1", buf, sizeof buf);
  const char *mono = strstr(buf, "MONOTONIC_USEC=");
  ck_assert_msg(mono, "RELOADING=1 without MONOTONIC_USEC: %s", buf);
  unsigned long long usec = strtoull(mono + strlen("MONOTONIC_USEC="), NULL, 10);
  ck_assert_uint_ge(usec, (unsigned long long)hup.tv_sec * 1000000ull + hup.tv_nsec / 1000);
  recv_tag(ns, "READY=1", buf, sizeof buf);
  /* A reload that fails ends with READY=1 too (else systemctl reload would
   * wait for its timeout), and says why. */
  FILE *f = fopen(d.conf, "w");
  ck_assert_ptr_nonnull(f);
  fputs("[sessions]\nttl = soon\n", f);
  fclose(f);
  kill(d.pid, SIGHUP);
  recv_tag(ns, "RELOADING=1", buf, sizeof buf);
  recv_tag(ns, "READY=1", buf, sizeof buf);
  ck_assert_msg(strstr(buf, "STATUS=reload failed") && strstr(buf, "ttl"), "%s", buf);
  kill(d.pid, SIGTERM);
  bool stopping = false;
  t0 = dh_now();
  while (dh_now() - t0 < 3 && !stopping) {
    char buf[512];
    ssize_t n = recv(ns, buf, sizeof buf - 1, 0);
    if (n <= 0) continue;
    buf[n] = 0;
    stopping = strstr(buf, "STOPPING=1") != NULL;
  }
  ck_assert(stopping);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  close(ns);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon_basic");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_ping_status);
  tcase_add_test(tc, test_register_init_run);
  tcase_add_test(tc, test_bad_requests);
  tcase_add_test(tc, test_two_places);
  tcase_add_test(tc, test_start_refuses_unusable_places);
  tcase_add_test(tc, test_sd_notify);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
