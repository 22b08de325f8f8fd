/* ProgramDesc decode/encode: round trip, and structural errors that
 * protobuf-c lets through (enums, dims, names, block graph) or catches
 * (garbage, truncation). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "ir/program.h"
#include "compiler/validate.h"
#include "prog_util.h"
#include "program.pb-c.h"
#include "test_assert.h"

/* A program exercising every field kind: two blocks, every attr type,
 * multi-arg slots, flags, train spec. */
static pe_program *sample_program(void) {
  pe_program *p = pe_program_new();
  pe_block *m, *s;
  PE_CK_OK(pe_program_add_block(p, -1, &m));
  PE_CK_OK(pe_program_add_block(p, -1, &s));
  p->version = PE_PROGRAM_VERSION; /* not the default 0: the field round-trips */
  p->main_block = 0;
  p->startup_block = 1;
  p->loss = strdup("loss");
  p->opt.type = strdup("adamw");
  p->opt.lr = 0.01f;
  p->opt.beta1 = 0.8f;
  p->opt.beta2 = 0.99f;
  p->opt.epsilon = 1e-7f;
  p->opt.momentum = 0.5f;
  p->opt.nesterov = true;
  p->opt.weight_decay = 5e-4f;
  p->opt.grad_clip_norm = 2.5f;
  p->opt.sched.type = strdup("multistep");
  p->opt.sched.warmup_steps = 7;
  p->opt.sched.gamma = 0.5f;
  p->opt.sched.n_milestones = 2;
  p->opt.sched.milestones[0] = 100;
  p->opt.sched.milestones[1] = 250;
  pe_var_desc *v;
  pe_shape sx = PE_SHAPE(-1, 4), sw = PE_SHAPE(4, 2), s1 = PE_SHAPE(1);
  PE_CK_OK(pe_block_add_var(m, "x", PE_F32, &sx, &v));
  v->is_feed = true;
  v->stop_gradient = true;
  PE_CK_OK(pe_block_add_var(m, "w", PE_F64, &sw, &v));
  v->persistable = true;
  v->no_weight_decay = true;
  PE_CK_OK(pe_block_add_var(m, "loss", PE_F32, &s1, NULL));
  PE_CK_OK(pe_block_add_var(m, "lbl", PE_I64, NULL, NULL));
  pe_op_desc *op;
  PE_CK_OK(pe_block_append_op(m, "matmul", &op));
  PE_CK_OK(pe_op_input1(op, "X", "x"));
  PE_CK_OK(pe_op_input1(op, "Y", "w"));
  const char *outs[] = {"loss", "lbl"};
  PE_CK_OK(pe_op_set_output(op, "Out", 2, outs));
  PE_CK_OK(pe_op_set_output(op, "Empty", 0, NULL));
  PE_CK_OK(pe_op_set_int(op, "i", -7));
  PE_CK_OK(pe_op_set_long(op, "l", INT64_C(1) << 40));
  PE_CK_OK(pe_op_set_float(op, "f", 2.5f));
  PE_CK_OK(pe_op_set_bool(op, "b", true));
  PE_CK_OK(pe_op_set_string(op, "s", "max"));
  int64_t ints[] = {1, -1, 3};
  PE_CK_OK(pe_op_set_ints(op, "is", 3, ints));
  float fl[] = {0.5f, -1.5f};
  PE_CK_OK(pe_op_set_floats(op, "fs", 2, fl));
  const char *strs[] = {"a", "bc"};
  PE_CK_OK(pe_op_set_strings(op, "ss", 2, strs));
  bool bs[] = {true, false, true};
  PE_CK_OK(pe_op_set_bools(op, "bs", 3, bs));
  PE_CK_OK(pe_op_set_block(op, "blk", 1));
  PE_CK_OK(pe_op_set_ints(op, "empty", 0, NULL));
  PE_CK_OK(pe_block_append_op(s, "fill_constant", &op));
  PE_CK_OK(pe_op_output1(op, "Out", "w"));
  return p;
}

static void assert_attr_eq(const pe_attr *a, const pe_attr *b) {
  ck_assert_str_eq(a->name, b->name);
  ck_assert_int_eq(a->type, b->type);
  ck_assert_int_eq(a->i, b->i);
  ck_assert(a->f == b->f);
  ck_assert_str_eq(a->s ? a->s : "", b->s ? b->s : "");
  ck_assert_int_eq(a->n, b->n);
  for (int k = 0; k < a->n; k++) {
    if (a->ints) ck_assert_int_eq(a->ints[k], b->ints[k]);
    if (a->floats) ck_assert(a->floats[k] == b->floats[k]);
    if (a->strings) ck_assert_str_eq(a->strings[k], b->strings[k]);
  }
}

static void assert_program_eq(const pe_program *a, const pe_program *b) {
  ck_assert_uint_eq(a->version, b->version);
  ck_assert_int_eq(a->main_block, b->main_block);
  ck_assert_int_eq(a->startup_block, b->startup_block);
  ck_assert_str_eq(a->loss ? a->loss : "", b->loss ? b->loss : "");
  ck_assert_str_eq(a->opt.type ? a->opt.type : "", b->opt.type ? b->opt.type : "");
  ck_assert(a->opt.lr == b->opt.lr && a->opt.beta1 == b->opt.beta1 && a->opt.beta2 == b->opt.beta2);
  ck_assert(a->opt.epsilon == b->opt.epsilon && a->opt.momentum == b->opt.momentum);
  ck_assert(a->opt.nesterov == b->opt.nesterov && a->opt.weight_decay == b->opt.weight_decay);
  ck_assert(a->opt.grad_clip_norm == b->opt.grad_clip_norm);
  const pe_lr_schedule_desc *sa = &a->opt.sched, *sb = &b->opt.sched;
  ck_assert_str_eq(sa->type ? sa->type : "", sb->type ? sb->type : "");
  ck_assert(sa->warmup_steps == sb->warmup_steps && sa->decay_steps == sb->decay_steps);
  ck_assert(sa->gamma == sb->gamma && sa->min_lr == sb->min_lr);
  ck_assert_int_eq(sa->n_milestones, sb->n_milestones);
  for (int i = 0; i < sa->n_milestones; i++) ck_assert(sa->milestones[i] == sb->milestones[i]);
  ck_assert_int_eq(a->n_blocks, b->n_blocks);
  for (int bi = 0; bi < a->n_blocks; bi++) {
    const pe_block *x = a->blocks[bi], *y = b->blocks[bi];
    ck_assert_int_eq(x->idx, y->idx);
    ck_assert_int_eq(x->parent, y->parent);
    ck_assert_int_eq(x->n_vars, y->n_vars);
    for (int i = 0; i < x->n_vars; i++) {
      const pe_var_desc *u = x->vars[i], *v = y->vars[i];
      ck_assert_str_eq(u->name, v->name);
      ck_assert_int_eq(u->dtype, v->dtype);
      ck_assert(pe_shape_equal(&u->shape, &v->shape));
      ck_assert(u->persistable == v->persistable && u->stop_gradient == v->stop_gradient &&
                u->is_feed == v->is_feed && u->no_weight_decay == v->no_weight_decay);
    }
    ck_assert_int_eq(x->n_ops, y->n_ops);
    for (int i = 0; i < x->n_ops; i++) {
      const pe_op_desc *o = x->ops[i], *q = y->ops[i];
      ck_assert_str_eq(o->type, q->type);
      ck_assert_int_eq(o->n_in, q->n_in);
      ck_assert_int_eq(o->n_out, q->n_out);
      for (int dir = 0; dir < 2; dir++)
        for (int s = 0; s < (dir ? o->n_out : o->n_in); s++) {
          const pe_slot *ss = dir ? &o->out[s] : &o->in[s], *ts = dir ? &q->out[s] : &q->in[s];
          ck_assert_str_eq(ss->name, ts->name);
          ck_assert_int_eq(ss->n, ts->n);
          for (int k = 0; k < ss->n; k++) ck_assert_str_eq(ss->args[k], ts->args[k]);
        }
      ck_assert_int_eq(o->n_attr, q->n_attr);
      for (int k = 0; k < o->n_attr; k++) assert_attr_eq(&o->attrs[k], &q->attrs[k]);
    }
  }
}

START_TEST(round_trip) {
  pe_program *p = sample_program();
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_program_encode(p, &buf, &len));
  ck_assert_uint_gt(len, 0);
  pe_program *q;
  PE_CK_OK(pe_program_decode(buf, len, &q));
  assert_program_eq(p, q);
  /* Encoding the decoded program gives the same bytes. */
  uint8_t *buf2;
  size_t len2;
  PE_CK_OK(pe_program_encode(q, &buf2, &len2));
  ck_assert_uint_eq(len, len2);
  ck_assert(memcmp(buf, buf2, len) == 0);
  free(buf);
  free(buf2);
  pe_program_free(p);
  pe_program_free(q);
}
END_TEST

START_TEST(round_trip_without_training) {
  pe_program *p = pe_program_new();
  PE_CK_OK(pe_program_add_block(p, -1, NULL));
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_program_encode(p, &buf, &len));
  pe_program *q;
  PE_CK_OK(pe_program_decode(buf, len, &q));
  ck_assert_ptr_null(q->loss);
  ck_assert_ptr_null(q->opt.type);
  ck_assert_int_eq(q->startup_block, -1);
  free(buf);
  pe_program_free(p);
  pe_program_free(q);
}
END_TEST

static void expect_decode_error(const uint8_t *buf, size_t len, const char *want1,
                                const char *want2) {
  pe_program *q = (pe_program *)0x1;
  pe_status *st = pe_program_decode(buf, len, &q);
  ck_assert_ptr_null(q);
  expect_errors(st, PE_EINVAL, want1, want2, (const char *)NULL); /* want2 may be NULL */
}

START_TEST(garbage_bytes) {
  uint8_t junk[64];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(0xff - i * 7);
  expect_decode_error(junk, sizeof junk, "malformed ProgramDesc", NULL);
  const uint8_t bad_tag[] = {0x00, 0x01};
  expect_decode_error(bad_tag, sizeof bad_tag, "malformed ProgramDesc", NULL);
}
END_TEST

START_TEST(truncated_message) {
  pe_program *p = sample_program();
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_program_encode(p, &buf, &len));
  expect_decode_error(buf, len - 1, "malformed ProgramDesc", NULL);
  expect_decode_error(buf, len / 2, "malformed ProgramDesc", NULL);
  expect_decode_error(buf, 3, "malformed ProgramDesc", NULL);
  free(buf);
  pe_program_free(p);
}
END_TEST

/* Build a packed ProgramDesc by hand to express what the IR cannot hold. */
typedef struct raw {
  Pe__ProgramDesc pd;
  Pe__BlockDesc b[2], *bp[2];
  Pe__VarDesc v[2], *vp[2];
  Pe__OpDesc op, *opp[1];
  Pe__Attr at, *atp[1];
  int64_t shape[PE_MAX_DIMS + 2];
} raw;

static void raw_init(raw *r) {
  memset(r, 0, sizeof(*r));
  r->pd = (Pe__ProgramDesc)PE__PROGRAM_DESC__INIT;
  r->pd.startup_block = -1;
  r->pd.n_blocks = 1;
  r->pd.blocks = r->bp;
  for (int i = 0; i < 2; i++) {
    r->b[i] = (Pe__BlockDesc)PE__BLOCK_DESC__INIT;
    r->b[i].idx = i;
    r->b[i].parent_idx = -1;
    r->bp[i] = &r->b[i];
    r->v[i] = (Pe__VarDesc)PE__VAR_DESC__INIT;
    r->vp[i] = &r->v[i];
  }
  r->v[0].name = "x";
  r->v[1].name = "y";
  r->shape[0] = 2;
  r->shape[1] = 3;
  r->v[0].shape = r->shape;
  r->v[0].n_shape = 2;
  r->b[0].n_vars = 2;
  r->b[0].vars = r->vp;
  r->op = (Pe__OpDesc)PE__OP_DESC__INIT;
  r->op.type = "relu";
  r->opp[0] = &r->op;
  r->at = (Pe__Attr)PE__ATTR__INIT;
  r->at.name = "alpha";
  r->atp[0] = &r->at;
}

/* Put the relu op, with its one attribute, into block 0. */
static void raw_add_op(raw *r) {
  r->b[0].n_ops = 1;
  r->b[0].ops = r->opp;
  r->op.n_attrs = 1;
  r->op.attrs = r->atp;
}

static void raw_expect(raw *r, const char *want1, const char *want2) {
  size_t n = pe__program_desc__get_packed_size(&r->pd);
  uint8_t *buf = malloc(n + 1);
  pe__program_desc__pack(&r->pd, buf);
  expect_decode_error(buf, n, want1, want2);
  free(buf);
}

/* r packed and decoded, which must succeed. */
static pe_program *raw_decode(raw *r) {
  size_t n = pe__program_desc__get_packed_size(&r->pd);
  uint8_t buf[256];
  ck_assert_uint_le(n, sizeof buf);
  pe__program_desc__pack(&r->pd, buf);
  pe_program *q;
  PE_CK_OK(pe_program_decode(buf, n, &q));
  return q;
}

START_TEST(raw_baseline_decodes) {
  raw r;
  raw_init(&r);
  raw_add_op(&r);
  size_t n = pe__program_desc__get_packed_size(&r.pd);
  uint8_t *buf = malloc(n);
  pe__program_desc__pack(&r.pd, buf);
  pe_program *q;
  PE_CK_OK(pe_program_decode(buf, n, &q));
  ck_assert_int_eq(q->blocks[0]->n_vars, 2);
  ck_assert_int_eq(q->blocks[0]->vars[0]->shape.ndim, 2);
  pe_program_free(q);
  free(buf);
}
END_TEST

START_TEST(bad_enums) {
  raw r;
  raw_init(&r);
  r.v[1].dtype = (Pe__DataType)42;
  raw_expect(&r, "dtype 42", "'y'");
  raw_init(&r);
  r.v[0].dtype = (Pe__DataType)-1;
  raw_expect(&r, "dtype -1", "'x'");
  raw_init(&r);
  raw_add_op(&r);
  r.at.type = (Pe__AttrType)10;
  raw_expect(&r, "op #0 (relu)", "'alpha': type 10");
}
END_TEST

START_TEST(bad_dims) {
  raw r;
  raw_init(&r);
  r.shape[1] = -2;
  raw_expect(&r, "variable 'x'", "-2");
  raw_init(&r);
  for (int i = 0; i < PE_MAX_DIMS + 1; i++) r.shape[i] = 1;
  r.v[0].n_shape = PE_MAX_DIMS + 1;
  raw_expect(&r, "variable 'x'", "9 dims");
  raw_init(&r);
  r.shape[0] = INT64_C(1) << 30;
  r.shape[1] = INT64_C(1) << 30;
  raw_expect(&r, "variable 'x'", "elements");
}
END_TEST

START_TEST(duplicate_and_empty_vars) {
  raw r;
  raw_init(&r);
  r.v[1].no_weight_decay = true; /* only parameters (persistable) may opt out */
  raw_expect(&r,
             "block 0: variable 'y': no_weight_decay is for parameters, but 'y' is not "
             "persistable",
             NULL);
  r.v[1].persistable = true;
  pe_program *q = raw_decode(&r);
  ck_assert(q->blocks[0]->vars[1]->no_weight_decay && !q->blocks[0]->vars[0]->no_weight_decay);
  pe_program_free(q);
  raw_init(&r);
  r.v[1].name = "x";
  raw_expect(&r, "block 0", "'x' declared twice");
  raw_init(&r);
  r.v[1].name = "";
  raw_expect(&r, "block 0", "empty name");
}
END_TEST

/* A newer format is refused naming both versions; 0 (unset) and 1 read. */
START_TEST(bad_version) {
  raw r;
  raw_init(&r);
  r.pd.version = 999;
  raw_expect(&r, "version 999: this daemon reads ProgramDesc versions up to 1", NULL);
  for (uint32_t v = 0; v <= PE_PROGRAM_VERSION; v++) {
    raw_init(&r);
    r.pd.version = v;
    pe_program_free(raw_decode(&r));
  }
}
END_TEST

START_TEST(bad_blocks) {
  raw r;
  raw_init(&r);
  r.pd.n_blocks = 2;
  r.b[1].parent_idx = 7;
  raw_expect(&r, "block 1", "parent 7 out of range");
  raw_init(&r);
  r.pd.n_blocks = 2;
  r.b[0].parent_idx = 1;
  r.b[1].parent_idx = 0;
  raw_expect(&r, "block 0", "cyclic");
  raw_init(&r);
  r.b[0].parent_idx = 0; /* its own parent */
  raw_expect(&r, "block 0", "cyclic");
  raw_init(&r);
  r.pd.n_blocks = 2;
  r.b[1].idx = 5;
  raw_expect(&r, "position 1", "idx 5");
  raw_init(&r);
  r.pd.main_block = 3;
  raw_expect(&r, "main_block 3", NULL);
  raw_init(&r);
  r.pd.startup_block = 0; /* proto3 default: must be -1 when absent */
  raw_expect(&r, "startup_block 0", "main block");
  raw_init(&r);
  r.pd.n_blocks = 0;
  raw_expect(&r, "no blocks", NULL);
}
END_TEST

START_TEST(bad_ops_and_optimizer) {
  raw r;
  raw_init(&r);
  raw_add_op(&r);
  r.at.type = PE__ATTR_TYPE__BLOCK;
  r.at.block_idx = 4;
  raw_expect(&r, "op #0 (relu)", "block 4 out of range");

  raw_init(&r);
  Pe__TrainSpec ts = PE__TRAIN_SPEC__INIT;
  Pe__OptimizerDesc od = PE__OPTIMIZER_DESC__INIT;
  ts.optimizer = &od;
  r.pd.train = &ts;
  od.type = "rmsprop";
  od.learning_rate = 0.1f;
  raw_expect(&r, "optimizer type 'rmsprop' unknown (sgd, momentum, adam, adamw)", NULL);
  od.type = "sgd";
  od.learning_rate = -1.0f;
  raw_expect(&r, "learning_rate", NULL);
  od.learning_rate = 0.1f;
  od.beta1 = 1.5f;
  raw_expect(&r, "beta1", NULL);
  od.beta1 = 0.0f;
  od.weight_decay = -0.01f;
  raw_expect(&r, "optimizer sgd: weight_decay -0.01 must be finite and >= 0", NULL);
  od.weight_decay = NAN;
  raw_expect(&r, "weight_decay nan", NULL);
  od.weight_decay = 0.0f;
  od.grad_clip_norm = -1.0f;
  raw_expect(&r, "optimizer sgd: grad_clip_norm -1 must be finite and >= 0", NULL);
  od.grad_clip_norm = INFINITY;
  raw_expect(&r, "grad_clip_norm inf", NULL);
  od.grad_clip_norm = 0.0f;

  /* The schedule: checked as the optimizer pass and the op check it. */
  Pe__LrSchedule ls = PE__LR_SCHEDULE__INIT;
  od.lr_schedule = &ls;
  ls.type = "triangle";
  raw_expect(&r, "optimizer sgd: lr_schedule: type 'triangle' unknown (constant, step", NULL);
  ls.type = "cosine";
  raw_expect(&r, "lr_schedule cosine: decay_steps must be > 0", NULL);
  ls.decay_steps = 100;
  ls.min_lr = 0.2f;
  raw_expect(&r, "lr_schedule cosine: min_lr 0.2 must be in [0, learning rate 0.1)", NULL);
  ls.type = "multistep";
  int64_t ms[PE_LR_MAX_MILESTONES + 1] = {10, 5};
  ls.milestones = ms;
  ls.n_milestones = 2;
  raw_expect(&r, "milestone 1 (5) must be > 0 and greater than the one before", NULL);
  ls.n_milestones = PE_LR_MAX_MILESTONES + 1;
  raw_expect(&r, "lr_schedule multistep: 33 milestones (at most 32)", NULL);
  ls.type = "step";
  ls.n_milestones = 0;
  ls.warmup_steps = -3;
  raw_expect(&r, "lr_schedule step: warmup_steps -3 must be >= 0", NULL);
  ls.warmup_steps = 0;
  ls.gamma = 2.0f;
  raw_expect(&r, "lr_schedule step: gamma 2 must be in (0, 1]", NULL);
}
END_TEST

/* CPU seconds this process has used. */
static double cpu_s(void) {
  return (double)clock() / CLOCKS_PER_SEC;
}

/* An op naming a slot or an attribute twice is refused, naming both
 * entries; pairs far apart in a long list are found by a hash set. */
/* No bytes at all, as an unset bytes field arrives (NULL, 0): an error
 * from the decoder, and no pointer arithmetic on NULL in the count before
 * it (UBSan in the sanitizer build). */
START_TEST(empty_bytes_refused_without_ub) {
  pe_program *p = NULL;
  pe_status *st = pe_program_decode(NULL, 0, &p);
  if (st) {
    pe_status_free(st);
  } else {
    ck_assert_ptr_nonnull(p);
    pe_program_free(p);
  }
}
END_TEST

START_TEST(repeated_slots_and_attrs) {
  raw r;
  raw_init(&r);
  raw_add_op(&r);
  char *args[] = {"x"};
  Pe__OpSlot sl = PE__OP_SLOT__INIT, *slots[] = {&sl, &sl};
  sl.parameter = "X";
  sl.n_arguments = 1;
  sl.arguments = args;
  r.op.n_inputs = 2;
  r.op.inputs = slots;
  raw_expect(&r, "block 0: op #0 (relu): input slot 'X' is repeated (entries 0 and 1)", NULL);
  r.op.n_inputs = 0;
  r.op.n_outputs = 2;
  r.op.outputs = slots;
  raw_expect(&r, "block 0: op #0 (relu): output slot 'X' is repeated (entries 0 and 1)", NULL);
  r.op.n_outputs = 0;
  Pe__Attr *two[] = {&r.at, &r.at};
  r.op.n_attrs = 2;
  r.op.attrs = two;
  raw_expect(&r, "block 0: op #0 (relu): attribute 'alpha' is repeated (entries 0 and 1)", NULL);
}
END_TEST

/* An op of 200,000 attributes decodes in time linear in them (each name
 * compared with every earlier one, it took about a minute); one more
 * repeating the first is refused as fast. The bound is CPU time, 10x
 * what a sanitizer build needs. */
START_TEST(many_attrs_decode_linearly) {
  enum { N = 200000 };
  raw r;
  raw_init(&r);
  raw_add_op(&r);
  Pe__Attr *at = calloc(N + 1, sizeof *at);
  Pe__Attr **atp = calloc(N + 1, sizeof *atp);
  char(*names)[16] = calloc(N, sizeof *names);
  for (int i = 0; i < N; i++) {
    at[i] = (Pe__Attr)PE__ATTR__INIT;
    snprintf(names[i], sizeof names[i], "a%d", i);
    at[i].name = names[i];
    at[i].i = i;
    atp[i] = &at[i];
  }
  at[N] = at[0];
  atp[N] = &at[N];
  r.op.attrs = atp;
  r.op.n_attrs = N;
  size_t n = pe__program_desc__get_packed_size(&r.pd);
  uint8_t *buf = malloc(n);
  pe__program_desc__pack(&r.pd, buf);
  double t0 = cpu_s();
  pe_program *q;
  PE_CK_OK(pe_program_decode(buf, n, &q));
  ck_assert_int_eq(q->blocks[0]->ops[0]->n_attr, N);
  ck_assert_int_eq(pe_op_find_attr(q->blocks[0]->ops[0], "a199999")->i, N - 1);
  pe_program_free(q);
  free(buf);
  r.op.n_attrs = N + 1;
  n = pe__program_desc__get_packed_size(&r.pd);
  buf = malloc(n);
  pe__program_desc__pack(&r.pd, buf);
  expect_decode_error(buf, n, "attribute 'a0' is repeated (entries 0 and 200000)", NULL);
  double took = cpu_s() - t0;
  ck_assert_msg(took < 20, "decoding 2 x 200000 attributes took %.1f s of CPU", took);
  free(buf);
  free(names);
  free(atp);
  free(at);
}
END_TEST

/* Every single-byte corruption of a valid message either decodes (and then
 * validates or fails cleanly) or fails with PE_EINVAL; under ASan this is a
 * small fuzz run of decode + validate. */
/* A valid training program (forward, backward, optimizer, startup), so that
 * corrupted copies get past decode into validation and row inference. */
static pe_program *train_program(void) {
  pe_program *p = pe_program_new();
  pe_block *m, *s;
  PE_CK_OK(pe_program_add_block(p, -1, &m));
  PE_CK_OK(pe_program_add_block(p, -1, &s));
  p->startup_block = 1;
  pu_feed(m, "x", PE_F32, PE_SHAPE(-1, 1, 4, 4));
  pu_feed(m, "lbl", PE_I64, PE_SHAPE(-1, 1));
  pu_param(m, "w", PE_SHAPE(16, 3));
  pu_param(m, "b", PE_SHAPE(3));
  const char *tmps[] = {"p", "f", "h", "y", "r", "prob", "ce", "loss"};
  for (int i = 0; i < 8; i++) pu_var(m, tmps[i], PE_F32, NULL);
  pe_op_desc *op = pu_op(m, "pool2d", "X", "x", NULL, "Out", "p", NULL);
  PE_CK_OK(pe_op_set_ints(op, "ksize", 2, (int64_t[]){1, 1}));
  pu_op(m, "flatten", "X", "p", NULL, "Out", "f", NULL);
  pu_op(m, "matmul", "X", "f", "Y", "w", NULL, "Out", "h", NULL);
  pu_op(m, "elementwise_add", "X", "h", "Y", "b", NULL, "Out", "y", NULL);
  pu_op(m, "relu", "X", "y", NULL, "Out", "r", NULL);
  pu_op(m, "softmax_with_cross_entropy", "Logits", "r", "Label", "lbl", NULL, "Softmax", "prob",
        "Loss", "ce", NULL);
  pu_op(m, "mean", "X", "ce", NULL, "Out", "loss", NULL);
  op = pu_op(s, "gaussian_random", NULL, "Out", "w", NULL);
  PE_CK_OK(pe_op_set_ints(op, "shape", 2, (int64_t[]){16, 3}));
  op = pu_op(s, "fill_constant", NULL, "Out", "b", NULL);
  PE_CK_OK(pe_op_set_ints(op, "shape", 1, (int64_t[]){3}));
  p->loss = strdup("loss");
  p->opt.type = strdup("adam");
  p->opt.lr = 0.01f;
  PE_CK_OK(pe_program_compile(p, false));
  return p;
}

static void mutate_all(pe_program *p) {
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_program_encode(p, &buf, &len));
  const uint8_t deltas[] = {0x01, 0x80, 0xff, 0x7f};
  int decoded = 0;
  for (size_t i = 0; i < len; i++)
    for (size_t d = 0; d < sizeof deltas; d++) {
      uint8_t *m = malloc(len);
      memcpy(m, buf, len);
      m[i] ^= deltas[d];
      pe_program *q = NULL;
      pe_status *st = pe_program_decode(m, len, &q);
      if (st) {
        ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
        ck_assert_ptr_null(q);
      } else {
        decoded++;
        pe_status_free(pe_program_validate(q));
        pe_program_free(q);
      }
      pe_status_free(st);
      free(m);
    }
  ck_assert_int_gt(decoded, 0);
  free(buf);
  pe_program_free(p);
}

START_TEST(compiled_program_round_trip) {
  pe_program *p = train_program();
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_program_encode(p, &buf, &len));
  pe_program *q;
  PE_CK_OK(pe_program_decode(buf, len, &q));
  assert_program_eq(p, q);
  PE_CK_OK(pe_program_validate(q));
  free(buf);
  pe_program_free(p);
  pe_program_free(q);
}
END_TEST

START_TEST(mutations_never_crash) {
  mutate_all(sample_program());
  mutate_all(train_program());
}
END_TEST

static Suite *proto_suite(void) {
  Suite *s = suite_create("proto");
  TCase *tc = tcase_create("proto");
  tcase_add_test(tc, round_trip);
  tcase_add_test(tc, round_trip_without_training);
  tcase_add_test(tc, garbage_bytes);
  tcase_add_test(tc, truncated_message);
  tcase_add_test(tc, raw_baseline_decodes);
  tcase_add_test(tc, bad_enums);
  tcase_add_test(tc, bad_dims);
  tcase_add_test(tc, duplicate_and_empty_vars);
  tcase_add_test(tc, bad_version);
  tcase_add_test(tc, bad_blocks);
  tcase_add_test(tc, bad_ops_and_optimizer);
  tcase_add_test(tc, empty_bytes_refused_without_ub);
  tcase_add_test(tc, repeated_slots_and_attrs);
  tcase_add_test(tc, many_attrs_decode_linearly);
  tcase_add_test(tc, compiled_program_round_trip);
  tcase_add_test(tc, mutations_never_crash);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(proto_suite)
