/* Internals of the program builder shared by builder.c (variables, ops,
 * parameters, serialisation) and the layer calls (builder_layers.c,
 * builder_seq.c, builder_attention.c, builder_position.c). Not
 * installed; trainers use pe_builder.h. The peb_ helpers are no-ops (return
 * NULL / false) once the builder holds an error. */
#ifndef PE_CLIENT_BUILDER_INTERNAL_H
#define PE_CLIENT_BUILDER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/strmap.h"
#include "pe_builder.h"
#include "program.pb-c.h"

#define B_MAX_DIMS 8
#define B_MAX_SLOTS 6
#define B_MAX_ATTRS 10
#define B_NAME_LEN 256
#define B_MAX_SPLIT PE_B_MAX_SPLIT

typedef struct b_attr {
  char *name;
  Pe__AttrType type;
  int64_t i; /* INT, LONG, BOOL */
  float f;
  char *s;
  int n;
  int64_t *ints;
} b_attr;

typedef struct b_slot {
  char *name;
  int n;       /* variables bound: one, or several (concat's X, split's Out) */
  char **args; /* owned, n of them */
} b_slot;

typedef struct b_op {
  char *type;
  int n_in, n_out, n_attr;
  b_slot in[B_MAX_SLOTS], out[B_MAX_SLOTS];
  b_attr attrs[B_MAX_ATTRS];
} b_op;

typedef struct b_var {
  char *name;
  int dtype;
  int ndim;
  int64_t d[B_MAX_DIMS];
  bool persistable, stop_gradient, is_feed;
  bool no_weight_decay; /* pe_builder_no_weight_decay (main and startup copies) */
  bool causal_mask;     /* made by pe_builder_causal_mask: fused attention's causal flag */
} b_var;

typedef struct b_block {
  int n_vars, cap_vars;
  b_var **vars;
  pe_strmap var_index; /* name -> b_var* (vars owns them): a lookup per layer input */
  int n_ops, cap_ops;
  b_op **ops;
} b_block;

typedef struct b_counter {
  const char *kind; /* static string */
  int n;
} b_counter;

/* pe_builder_lr_schedule's options, copied. */
typedef struct b_sched {
  const char *type; /* a static kind name; NULL: no schedule */
  int64_t warmup, decay;
  float gamma, min_lr;
  int n_ms;
  int64_t ms[PE_B_MAX_MILESTONES];
} b_sched;

struct pe_builder {
  b_block main, startup;
  char *err; /* first error, sticky */
  char *loss;
  char *opt_type; /* NULL: no optimizer */
  float lr, mu, beta1, beta2, eps;
  float weight_decay; /* pe_builder_weight_decay; kept across optimizer setters */
  bool no_decay_1d;   /* pe_builder_no_weight_decay_1d: applied at finish */
  float clip_norm;    /* pe_builder_grad_clip_norm; kept across optimizer setters */
  bool nesterov;
  b_sched sched; /* pe_builder_lr_schedule; kept across optimizer setters */
  /* pe_builder_attention_composed: attention layers compose, not fuse */
  bool attn_composed;
  b_counter counters[16];
  int n_counters;
};

/* Record the first error (later ones are dropped). */
void peb_fail(pe_builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The main-block variable x, input of `layer`; NULL (and an error) if absent. */
b_var *peb_need(pe_builder *b, const char *layer, const char *x);
b_var *peb_var_find(const b_block *blk, const char *name);
/* Declare a non-persistable main-block variable. */
b_var *peb_tmp_var(pe_builder *b, const char *name, int dt, int ndim, const int64_t *d);
/* Declare a variable of block blk (its flags are the caller's to set). */
b_var *peb_block_var(pe_builder *b, b_block *blk, const char *name, int dt, int ndim,
                     const int64_t *d);
/* Append an op; NULL after an error. The op_in/op_out/attr_* calls accept NULL. */
b_op *peb_op_add(pe_builder *b, b_block *blk, const char *type);
void peb_op_in(pe_builder *b, b_op *op, const char *slot, const char *arg);
void peb_op_out(pe_builder *b, b_op *op, const char *slot, const char *arg);
/* A slot bound to n variables, in order (n >= 1). */
void peb_op_in_n(pe_builder *b, b_op *op, const char *slot, int n, const char *const *args);
void peb_op_out_n(pe_builder *b, b_op *op, const char *slot, int n, const char *const *args);
void peb_attr_int(pe_builder *b, b_op *op, const char *name, int64_t v);
void peb_attr_float(pe_builder *b, b_op *op, const char *name, float v);
void peb_attr_bool(pe_builder *b, b_op *op, const char *name, bool v);
void peb_attr_str(pe_builder *b, b_op *op, const char *name, const char *v);
void peb_attr_ints(pe_builder *b, b_op *op, const char *name, int n, const int64_t *v);
/* The user's layer name (checked) or "<kind>_<k>", into buf[B_NAME_LEN]. */
bool peb_layer_name(pe_builder *b, const char *kind, const char *user, char *buf);
/* "<layer>.<suffix>" into buf[B_NAME_LEN]. */
const char *peb_vname(char *buf, const char *layer, const char *suffix);
/* A persistable f32 parameter declared in both blocks and initialised in the
 * startup block; trainable false sets stop_gradient (running statistics). */
bool peb_param_add(pe_builder *b, const char *name, int ndim, const int64_t *d, pe_b_init init,
                   double fan_in, double fan_out, bool trainable);
/* i, or the kind dflt when i asks for the default. */
pe_b_init peb_init_or(pe_b_init i, pe_b_init_kind dflt);
/* "[-1,784]" into buf. */
const char *peb_shape_str(const b_var *v, char *buf, size_t len);
/* Product of d[from..to); -1 if any is unknown. */
int64_t peb_prod(const int64_t *d, int from, int to);

#endif
