/* Register's compile step (registry/internal.h, pe_reg_compile): a
 * RegisterRequest's program bytes and options become the main and startup
 * graphs for the model's places, and the program's parameter and feed
 * declarations. It runs outside the registry lock and touches none of the
 * registry's tables, which is why it is apart from registry/register.c (the
 * handle, the model, the publish). */
#include <string.h>

#include "compiler/pass.h"
#include "core/names_unique.h"
#include "ir/program.h"
#include "server/heap_trim.h"
#include "server/registry/internal.h"

/* Input slots, output slots and attributes of one op, each: an op's
 * schema has a few dozen at most; more is refused before the unpack
 * allocates them (program_scan.h). */
#define PE_MAX_OP_ENTRIES 1024

/* seen: the names in arr (the startup block declares the persistables
 * again); a map, as a scan of arr made a large program's register quadratic. */
static pe_status *add_info(pe_var_info **arr, int *n, int *cap, pe_strmap *seen,
                           const pe_var_desc *v) {
  if (pe_strmap_has(seen, v->name)) return NULL;
  if (!pe_strmap_put(seen, v->name, NULL) || !pe_reg_grow((void **)arr, cap, *n + 1, sizeof **arr))
    return pe_error(PE_ENOMEM, "register: out of memory");
  pe_var_info *x = &(*arr)[*n];
  x->name = strdup(v->name);
  if (!x->name) return pe_error(PE_ENOMEM, "register: out of memory");
  x->dtype = v->dtype;
  x->shape = v->shape;
  (*n)++;
  return NULL;
}

/* Register's optimizer override replaces the program's whole optimizer
 * (weight decay and schedule included), checked as decode checks it. */
static pe_status *apply_optimizer(pe_program *prog, const Pe__OptimizerDesc *od) {
  if (!od || !od->type || !od->type[0]) return NULL;
  return pe_status_wrap(pe_optimizer_decode(od, &prog->opt), "register: options.optimizer");
}

/* Decode, apply options, compile; fills the program's graphs and var infos. */
pe_status *pe_reg_compile(pe_server *s, const Pe__RegisterRequest *rq, const pe_limits *lim,
                          pe_place_kind kind, int n_places, pe_graph **main_g, pe_graph **startup_g,
                          pe_srv_program *p) {
  const Pe__RegisterOptions *o = rq->options;
  pe_program *prog = NULL;
  /* The ProgramDesc's unpack has a budget of its own, as large as a
   * request's, from the same daemon-wide pool (decode_budget.h). */
  pe_decode_budget budget;
  pe_decode_budget_init(&budget, &s->decode_pool, lim->memory_requests_total,
                        lim->memory_per_request);
  pe_decode_limits dl = {lim->max_program_ops,       lim->max_program_vars,
                         "[limits] max_program_ops", "[limits] max_program_vars",
                         PE_MAX_OP_ENTRIES,          &budget.alloc};
  pe_status *dst = pe_program_decode_limited(rq->program.data, rq->program.len, &dl, &prog);
  pe_status *over = dst ? pe_decode_budget_error(&budget, "ProgramDesc", rq->program.len) : NULL;
  if (over) { /* the unpack failed for the budget, not for the bytes */
    pe_status_free(dst);
    dst = over;
  }
  PE_TRY(pe_status_wrap(dst, "register: program (%zu bytes)", rq->program.len));
  pe_status *st = apply_optimizer(prog, o ? o->optimizer : NULL);
  pe_pass_opts po = {0};
  po.place_kind = kind;
  po.n_places = n_places;
  po.fuse_conv_act = !(o && o->no_op_fusion);
  /* SIGTERM abandons a register (a large program compiles for seconds):
   * the shutdown checkpoints must not wait for it. */
  po.cancel = &s->stopping;
  po.cancel_why = "the daemon is shutting down (SIGTERM/SIGINT); register again once it is back";
  if (o) {
    if (o->loss && o->loss[0]) po.loss = o->loss;
    if (o->strategy != PE__STRATEGY__ALLREDUCE && o->strategy != PE__STRATEGY__REDUCE &&
        o->strategy != PE__STRATEGY__SHARDED && o->strategy != PE__STRATEGY__AUTO && !st)
      st = pe_error(PE_EINVAL,
                    "register: options.strategy %d unknown (0 allreduce, 1 reduce, 2 sharded, "
                    "3 auto)",
                    (int)o->strategy);
    po.strategy = o->strategy == PE__STRATEGY__REDUCE    ? PE_STRATEGY_REDUCE
                  : o->strategy == PE__STRATEGY__SHARDED ? PE_STRATEGY_SHARDED
                  : o->strategy == PE__STRATEGY__AUTO    ? pe_strategy_auto(kind, prog)
                                                         : PE_STRATEGY_ALLREDUCE;
    po.fuse = o->fuse_allreduce;
    if (o->fuse_bucket_bytes < 0 && !st)
      st = pe_error(PE_EINVAL, "register: options.fuse_bucket_bytes %lld must be >= 0",
                    (long long)o->fuse_bucket_bytes);
    po.fuse_bucket_bytes = o->fuse_bucket_bytes;
    if (!st)
      st = pe_status_wrap(pe_names_unique(o->keep, o->n_keep, pe_name_at_str, "options.keep name"),
                          "register");
    po.n_keep = (int)o->n_keep;
    po.keep = (const char *const *)o->keep;
  }
  /* A job across nodes sums every gradient over the nodes: AllReduce. */
  if (o && o->job && !o->for_test) {
    po.cross_nodes = true;
    p->in_job = true;
    if (o->strategy == PE__STRATEGY__AUTO) po.strategy = PE_STRATEGY_ALLREDUCE;
  }
  p->strategy = po.strategy;
  pe_ir ir = {.prog = prog, .opts = &po};
  if (!st) st = pe_status_wrap(pe_graph_compile(&ir, o && o->for_test), "register: compile");
  /* Declarations after the passes: the optimizer adds its state. */
  int cap_params = 0, cap_feeds = 0;
  pe_strmap seen_params, seen_feeds;
  pe_strmap_init(&seen_params);
  pe_strmap_init(&seen_feeds);
  for (int b = 0; b < prog->n_blocks && !st; b++) {
    if (b != prog->main_block && b != prog->startup_block) continue;
    pe_block *blk = prog->blocks[b];
    for (int i = 0; i < blk->n_vars && !st; i++) {
      pe_var_desc *v = blk->vars[i];
      if (v->persistable) st = add_info(&p->params, &p->n_params, &cap_params, &seen_params, v);
      if (v->is_feed && b == prog->main_block)
        st = add_info(&p->feeds, &p->n_feeds, &cap_feeds, &seen_feeds, v);
    }
  }
  pe_strmap_destroy(&seen_params);
  pe_strmap_destroy(&seen_feeds);
  if (st) {
    pe_ir_destroy(&ir);
  } else {
    p->read_only = true;
    for (int i = 0; i < ir.graph->n_nodes; i++)
      if (pe_graph_node_updates_persistable(ir.graph, i)) p->read_only = false;
    *main_g = ir.graph;
    *startup_g = ir.startup;
    ir.graph = ir.startup = NULL;
  }
  pe_program_free(prog);
  /* The decoded program and the passes' temporaries are free now. */
  pe_heap_trim_after_program(rq->program.len);
  return st;
}
