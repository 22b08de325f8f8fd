/* The pass table and manager (pass.h), plus the small passes: validate,
 * inference and dump. Passes are rows of a table (name, doc, run, rewrites,
 * target); the manager runs a comma-separated list, wraps each failure with
 * the pass name, validates the program again after every pass that rewrites
 * it, and refuses a graph pass before data_parallel has built the graph. */
#include "compiler/pass.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/validate.h"
#include "ops/registry.h"

static const pe_pass pass_table[] = {
    {"validate", "check ops, variables, arity, attributes, order; infer shapes", pe_pass_validate,
     false, PE_PASS_PROGRAM},
    {"backward", "append gradient ops for the loss; sum shared gradients; prune", pe_pass_backward,
     true, PE_PASS_PROGRAM},
    {"optimizer", "append one update op per trainable parameter; init state in startup",
     pe_pass_optimizer, true, PE_PASS_PROGRAM},
    {"inference", "set is_test on every op that has it (dropout, batch_norm)", pe_pass_inference,
     true, PE_PASS_PROGRAM},
    {"fuse_conv_act",
     "conv2d or matmul + bias add (+ relu) into one conv2d or matmul with Bias (and relu); "
     "batch_norm + relu into one batch_norm with fuse_activation relu",
     pe_pass_fuse_conv_act, true, PE_PASS_PROGRAM},
    {"fuse_add_act",
     "elementwise_add of two same-shape operands + relu into one elementwise_add with "
     "fuse_activation relu (a residual block's sum)",
     pe_pass_fuse_add_act, true, PE_PASS_PROGRAM},
    {"layout_blocked",
     "keep activations between conv2d, pool2d and their gradients in oneDNN's blocked layout "
     "(attribute layout_blocked; [runtime] conv_layout)",
     pe_pass_layout_blocked, true, PE_PASS_PROGRAM},
    {"data_parallel",
     "build the graph: replicate on every place, scale loss@GRAD, insert all_reduce (or "
     "reduce + broadcast); startup graph broadcasts from place 0",
     pe_pass_data_parallel, false, PE_PASS_GRAPH},
    {"ssa", "version variables, dummy vars for write-after-read, in-degrees, successors, cycles",
     pe_pass_ssa, false, PE_PASS_GRAPH},
    {"fuse_allreduce", "group gradient all_reduces into buckets of at most fuse_bucket_bytes",
     pe_pass_fuse_allreduce, false, PE_PASS_GRAPH},
    {"memory_plan", "share buffers between temporaries whose lifetimes are ordered",
     pe_pass_memory_plan, false, PE_PASS_GRAPH},
    {"dump", "write the graph as Graphviz to dump_path", pe_pass_dump, false, PE_PASS_GRAPH},
};

#define N_PASSES ((int)(sizeof pass_table / sizeof pass_table[0]))

const pe_pass *pe_pass_table(int *n) {
  *n = N_PASSES;
  return pass_table;
}

const pe_pass *pe_pass_lookup(const char *name) {
  for (int i = 0; name && i < N_PASSES; i++)
    if (strcmp(pass_table[i].name, name) == 0) return &pass_table[i];
  return NULL;
}

void pe_ir_destroy(pe_ir *ir) {
  if (!ir) return;
  pe_graph_free(ir->graph);
  pe_graph_free(ir->startup);
  ir->graph = ir->startup = NULL;
}

/* Test hook: PE_TEST_PASS_DELAY_MS=N sleeps N ms before each pass, so that
 * a test can stop the daemon while a small program compiles
 * (e2e.test_program_limits). Read once, at the first pass of the process
 * (pthread_once: compiles run on several request threads), not per pass. */
static long test_delay_ms;
static pthread_once_t test_delay_once = PTHREAD_ONCE_INIT;

static void test_delay_read(void) {
  const char *e = getenv("PE_TEST_PASS_DELAY_MS");
  test_delay_ms = e ? strtol(e, NULL, 10) : 0;
}

static void test_delay(void) {
  pthread_once(&test_delay_once, test_delay_read);
  long ms = test_delay_ms;
  if (ms > 0) nanosleep(&(struct timespec){ms / 1000, ms % 1000 * 1000000L}, NULL);
}

static pe_status *run_one(pe_ir *ir, const pe_pass *ps) {
  if (!ir->prog) return pe_error(PE_EINVAL, "pass %s: the compile unit has no program", ps->name);
  test_delay();
  if (ir->opts && ir->opts->cancel && atomic_load(ir->opts->cancel))
    return pe_error(PE_EIO, "%s: stopped before pass %s",
                    ir->opts->cancel_why ? ir->opts->cancel_why : "compile cancelled", ps->name);
  /* data_parallel builds the graph; every other graph pass needs one. */
  if (ps->target == PE_PASS_GRAPH && ps->run != pe_pass_data_parallel && !ir->graph)
    return pe_error(PE_EINVAL, "pass %s: no graph (run data_parallel first)", ps->name);
  pe_status *st = ps->run(ir);
  if (st) return pe_status_wrap(st, "pass %s", ps->name);
  if (ps->rewrites) {
    st = pe_program_validate(ir->prog);
    if (st) return pe_status_wrap(st, "validate after pass %s", ps->name);
  }
  return NULL;
}

pe_status *pe_pass_run(pe_ir *ir, const char *name) {
  const pe_pass *ps = pe_pass_lookup(name);
  if (!ps) return pe_error(PE_ENOTFOUND, "unknown pass '%s'", name ? name : "(null)");
  return run_one(ir, ps);
}

pe_status *pe_passes_run(pe_ir *ir, const char *list) {
  for (const char *s = list; s && *s;) {
    const char *e = strchr(s, ',');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    char name[64];
    /* Tolerate spaces around names ("validate, backward"). */
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    if (n == 0 || n >= sizeof name)
      return pe_error(PE_EINVAL, "pass list '%s': empty or too long pass name", list);
    memcpy(name, s, n);
    name[n] = '\0';
    PE_TRY(pe_pass_run(ir, name));
    s = e ? e + 1 : NULL;
  }
  return NULL;
}

static const char *program_pipeline(const pe_program *p, bool for_test) {
  if (for_test) return "validate,inference";
  if (p->loss) return "validate,backward,optimizer";
  return "validate";
}

/* The op-fusion passes first when asked for (they check opts and the place
 * kind; fuse_conv_act before fuse_add_act, which would otherwise take a
 * relu a product's bias add leads to), then the standard pipeline, then
 * layout_blocked (it checks opts, the place kind and the conv_layout mode). */
static pe_status *program_passes(pe_ir *ir, bool for_test) {
  if (ir->opts && ir->opts->fuse_conv_act)
    PE_TRY(pe_passes_run(ir, "validate,fuse_conv_act,fuse_add_act"));
  PE_TRY(pe_passes_run(ir, program_pipeline(ir->prog, for_test)));
  /* Last: it needs every reader of a variable, gradients included. */
  if (ir->opts && ir->opts->fuse_conv_act) PE_TRY(pe_pass_run(ir, "layout_blocked"));
  return NULL;
}

pe_status *pe_program_compile(pe_program *p, bool for_test) {
  return pe_program_compile_opts(p, for_test, NULL);
}

pe_status *pe_program_compile_opts(pe_program *p, bool for_test, const pe_pass_opts *opts) {
  pe_ir ir = {.prog = p, .opts = opts};
  return program_passes(&ir, for_test);
}

pe_status *pe_graph_compile(pe_ir *ir, bool for_test) {
  static const pe_pass_opts none = {0};
  const pe_pass_opts *o = ir->opts ? ir->opts : &none;
  if (!ir->prog) return pe_error(PE_EINVAL, "compile: the compile unit has no program");
  PE_TRY(program_passes(ir, for_test));
  PE_TRY(pe_passes_run(ir, "data_parallel,ssa"));
  if (o->fuse) PE_TRY(pe_pass_run(ir, "fuse_allreduce"));
  PE_TRY(pe_pass_run(ir, "memory_plan"));
  if (o->dump_path) PE_TRY(pe_pass_run(ir, "dump"));
  return NULL;
}

pe_status *pe_pass_validate(pe_ir *ir) {
  return pe_program_validate(ir->prog);
}

pe_status *pe_pass_inference(pe_ir *ir) {
  pe_program *p = ir->prog;
  for (int bi = 0; bi < p->n_blocks; bi++) {
    pe_block *b = p->blocks[bi];
    for (int i = 0; i < b->n_ops; i++) {
      const pe_op_def *def = pe_op_lookup(b->ops[i]->type);
      const pe_attr_def *ad = def ? pe_op_attr_def(def, "is_test") : NULL;
      if (!ad) continue;
      if (ad->type == PE_ATTR_BOOL)
        PE_TRY(pe_op_set_bool(b->ops[i], "is_test", true));
      else
        PE_TRY(pe_op_set_int(b->ops[i], "is_test", 1));
    }
  }
  return NULL;
}
