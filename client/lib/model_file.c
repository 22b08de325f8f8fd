/* Model files -> ProgramDesc (pe_model_file.h; format: conf/models/README.md).
 *
 * A line is a keyword, positional arguments and key=value options; bare
 * words listed as a row's flags are flags. Every keyword is a row of the
 * table below (arity, options, handler). Layers chain: each consumes the
 * current variable and makes its output current; `save` labels the current
 * variable, `from` makes a labelled one current and `add` sums it into the
 * current one (branches, residual connections). Loss and accuracy read the
 * current variable as logits. The optimizer, its schedule and the backward
 * mark are recorded at the end, so the file's order of `loss`, `accuracy`,
 * `optimizer` and `schedule` lines matters only for op order (pe_models.h
 * emits loss, then accuracy). Reading the file and resolving --model are
 * model_resolve.c; the sequence-model words are model_file_seq.c. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder_internal.h"
#include "model_file_internal.h"
#include "model_internal.h"
#include "pe_builder.h"
#include "pe_model_file.h"

#define MAX_LINE 1024

int mf_fail(mf *m, const char *fmt, ...) {
  if (m->failed) return -1;
  m->failed = true;
  int k = m->line ? snprintf(m->err, m->errlen, "%s:%d: ", m->source, m->line)
                  : snprintf(m->err, m->errlen, "%s: ", m->source);
  if (k < 0 || (size_t)k >= m->errlen) return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->err + k, m->errlen - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

/* --- argument readers ------------------------------------------------------------ */

const char *mf_opt_str(mf *m, const char *key) {
  for (int i = 0; i < m->n_opts; i++)
    if (m->opts[i].val && strcmp(m->opts[i].key, key) == 0) {
      m->opts[i].used = true;
      return m->opts[i].val;
    }
  return NULL;
}

bool mf_opt_flag(mf *m, const char *key) {
  for (int i = 0; i < m->n_opts; i++)
    if (!m->opts[i].val && strcmp(m->opts[i].key, key) == 0) return m->opts[i].used = true;
  return false;
}

int mf_parse_long(mf *m, const char *what, const char *s, long min, long max, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min || v > max)
    return mf_fail(m, "%s: %s '%s' is not an integer in [%ld, %ld]", m->kw, what, s, min, max);
  *out = v;
  return 0;
}

static int parse_float_in(mf *m, const char *what, const char *s, float min, float max, int open,
                          float *out) {
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  bool in = (open & OPEN_MIN ? v > min : v >= min) && (open & OPEN_MAX ? v < max : v <= max);
  if (errno || end == s || *end || !in)
    return mf_fail(m, "%s: %s '%s' is not a number in %c%g, %g%c", m->kw, what, s,
                   open & OPEN_MIN ? '(' : '[', min, max, open & OPEN_MAX ? ')' : ']');
  *out = v;
  return 0;
}

static int parse_float(mf *m, const char *what, const char *s, float min, float max, float *out) {
  return parse_float_in(m, what, s, min, max, CLOSED, out);
}

/* Integer option (absent: *out unchanged). */
int mf_opt_long(mf *m, const char *key, long min, long max, long *out) {
  const char *v = mf_opt_str(m, key);
  return v ? mf_parse_long(m, key, v, min, max, out) : 0;
}

int mf_opt_float_in(mf *m, const char *key, float min, float max, int open, float *out) {
  const char *v = mf_opt_str(m, key);
  return v ? parse_float_in(m, key, v, min, max, open, out) : 0;
}

static int opt_float(mf *m, const char *key, float min, float max, float *out) {
  return mf_opt_float_in(m, key, min, max, CLOSED, out);
}

/* "3" or "3x5" into a pair. */
static int parse_pair(mf *m, const char *what, const char *s, long min, int out[2]) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", s);
  char *x = strchr(buf, 'x');
  long a = 0, b = 0;
  if (x) *x = 0;
  if (mf_parse_long(m, what, buf, min, 1 << 16, &a)) return -1;
  b = a;
  if (x && mf_parse_long(m, what, x + 1, min, 1 << 16, &b)) return -1;
  out[0] = (int)a;
  out[1] = (int)b;
  return 0;
}

static int opt_pair(mf *m, const char *key, long min, int out[2]) {
  const char *v = mf_opt_str(m, key);
  return v ? parse_pair(m, key, v, min, out) : 0;
}

/* "A,B,C": integers in [min, max], at most cap of them (absent: *n unchanged). */
static int opt_long_list(mf *m, const char *key, long min, long max, int64_t *out, int cap,
                         int *n) {
  const char *v = mf_opt_str(m, key);
  if (!v) return 0;
  int k = 0;
  for (const char *p = v;;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (k == cap) return mf_fail(m, "%s: %s '%s' has more than %d values", m->kw, key, v, cap);
    char item[32];
    if (len == 0 || len >= sizeof item)
      return mf_fail(m, "%s: %s '%s' is not a comma-separated list of integers", m->kw, key, v);
    memcpy(item, p, len);
    item[len] = 0;
    long x = 0;
    if (mf_parse_long(m, key, item, min, max, &x)) return -1;
    out[k++] = x;
    if (!e) break;
    p = e + 1;
  }
  *n = k;
  return 0;
}

static int opt_act(mf *m, pe_b_act *out) {
  static const char *const names[] = {"none", "relu", "tanh", "sigmoid", "softmax"};
  const char *v = mf_opt_str(m, "act");
  if (!v) return 0;
  for (int i = 0; i < 5; i++)
    if (strcmp(v, names[i]) == 0) {
      *out = (pe_b_act)i;
      return 0;
    }
  return mf_fail(m, "%s: unknown act '%s' (known: none, relu, tanh, sigmoid, softmax)", m->kw, v);
}

int mf_need_input(mf *m) {
  if (!m->x) return mf_fail(m, "%s: no 'input' line before it", m->kw);
  if (m->loss) return mf_fail(m, "%s: a layer after the 'loss' line", m->kw);
  return 0;
}

/* After a builder call: its error, with the line. */
int mf_built(mf *m, const char *out) {
  if (out) {
    m->x = out;
    return 0;
  }
  return mf_fail(m, "%s: %s", m->kw, pe_builder_error(m->b) ? pe_builder_error(m->b) : "failed");
}

/* --- handlers ----------------------------------------------------------------------- */

/* The daemon's rule for model names (pe_name_check): checked here too, so
 * that the error carries the file and line. */
static int h_name(mf *m) {
  if (m->name_line) return mf_fail(m, "name: a second name line (line %d names it)", m->name_line);
  if (strlen(m->pos[0]) >= PE_MODEL_NAME_LEN)
    return mf_fail(m, "name: '%s' is longer than %d bytes", m->pos[0], PE_MODEL_NAME_LEN - 1);
  for (const char *c = m->pos[0]; *c; c++)
    if (!isalnum((unsigned char)*c) && *c != '.' && *c != '_' && *c != '-')
      return mf_fail(m, "name: '%s' has characters outside [A-Za-z0-9._-]", m->pos[0]);
  if (m->pos[0][0] == '.') return mf_fail(m, "name: '%s' starts with '.'", m->pos[0]);
  m->name_line = m->line;
  snprintf(m->name, sizeof m->name, "%s", m->pos[0]);
  return 0;
}

static int h_batch(mf *m) {
  long v = 0;
  if (mf_parse_long(m, "size", m->pos[0], 1, 1 << 16, &v)) return -1;
  m->batch = (int)v;
  return 0;
}

static int h_input(mf *m) {
  if (m->image) return mf_fail(m, "input: a second input ('%s' is declared)", m->image);
  int nd = m->n_pos - 1;
  if (nd > 3) return mf_fail(m, "input: %d dims (at most 3 besides the batch)", nd);
  int64_t dims[4] = {-1}, numel = 1;
  for (int i = 0; i < nd; i++) {
    long v = 0;
    if (mf_parse_long(m, "dim", m->pos[1 + i], 1, 1L << 30, &v)) return -1;
    dims[1 + i] = v;
    numel *= v; /* at most 2^40 x 2^30: no overflow */
    /* The daemon's limit for a declared shape's elements (each dim alone
     * passes; their product would overflow the layers' sizes). */
    if (numel > (INT64_C(1) << 40)) {
      char list[128];
      size_t k = 0;
      for (int j = 0; j < nd && k < sizeof list; j++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", j ? " x " : "", m->pos[1 + j]);
      return mf_fail(m, "input: dims %s make more than 2^40 elements per example", list);
    }
  }
  const char *img = pe_builder_data(m->b, m->pos[0], PE_B_F32, nd + 1, dims);
  if (mf_built(m, img)) return -1;
  m->image = img;
  m->image_ndim = nd + 1;
  memcpy(m->image_dims, dims, sizeof dims);
  return 0;
}

static int h_label(mf *m) {
  if (m->label) return mf_fail(m, "label: a second label ('%s' is declared)", m->label);
  const char *cur = m->x;
  const char *l = pe_builder_data(m->b, m->pos[0], PE_B_I64, PE_B_SHAPE(-1, 1));
  if (mf_built(m, l)) return -1;
  m->label = l;
  m->x = cur; /* the label is not a layer input */
  return 0;
}

static int h_fc(mf *m) {
  long size = 0, ncd = 0;
  pe_b_fc_opts o = {.name = mf_opt_str(m, "name"), .no_bias = mf_opt_flag(m, "no_bias")};
  if (mf_need_input(m) || mf_parse_long(m, "size", m->pos[0], 1, 1L << 30, &size) ||
      mf_opt_long(m, "num_col_dims", 1, 7, &ncd) || opt_act(m, &o.act))
    return -1;
  o.num_col_dims = (int)ncd;
  return mf_built(m, pe_builder_fc(m->b, m->x, size, &o));
}

static int h_conv2d(mf *m) {
  long out = 0, groups = 0;
  int k[2];
  pe_b_conv_opts o = {.name = mf_opt_str(m, "name"), .no_bias = mf_opt_flag(m, "no_bias")};
  if (mf_need_input(m) || mf_parse_long(m, "out_channels", m->pos[0], 1, 1L << 20, &out) ||
      parse_pair(m, "kernel", m->pos[1], 1, k) || opt_pair(m, "stride", 1, o.stride) ||
      opt_pair(m, "pad", 0, o.pad) || opt_pair(m, "dilation", 1, o.dilation) ||
      mf_opt_long(m, "groups", 1, 1L << 20, &groups) || opt_act(m, &o.act))
    return -1;
  o.groups = (int)groups;
  return mf_built(m, pe_builder_conv2d(m->b, m->x, out, k[0], k[1], &o));
}

static int h_pool2d(mf *m) {
  pe_b_pool_opts o = {.name = mf_opt_str(m, "name"),
                      .global = mf_opt_flag(m, "global"),
                      .inclusive = mf_opt_flag(m, "inclusive")};
  int k[2] = {1, 1};
  if (mf_need_input(m)) return -1;
  if (strcmp(m->pos[0], "avg") == 0)
    o.avg = true;
  else if (strcmp(m->pos[0], "max") != 0)
    return mf_fail(m, "pool2d: kind '%s' is not max or avg", m->pos[0]);
  if (m->n_pos < 2 && !o.global) return mf_fail(m, "pool2d: no kernel size (or 'global')");
  if (m->n_pos >= 2 && parse_pair(m, "kernel", m->pos[1], 1, k)) return -1;
  if (opt_pair(m, "stride", 1, o.stride) || opt_pair(m, "pad", 0, o.pad)) return -1;
  return mf_built(m, pe_builder_pool2d(m->b, m->x, k[0], k[1], &o));
}

static int h_batch_norm(mf *m) {
  pe_b_bn_opts o = {.name = mf_opt_str(m, "name")};
  if (mf_need_input(m) || opt_float(m, "momentum", 0, 1, &o.momentum) ||
      opt_float(m, "epsilon", 0, 1, &o.epsilon) || opt_act(m, &o.act))
    return -1;
  return mf_built(m, pe_builder_batch_norm(m->b, m->x, &o));
}

static int h_dropout(mf *m) {
  float p = 0;
  long seed = 0;
  if (mf_need_input(m) || parse_float(m, "probability", m->pos[0], 0, 0.999999f, &p) ||
      mf_opt_long(m, "seed", 0, 1L << 62, &seed))
    return -1;
  return mf_built(m, pe_builder_dropout(m->b, m->x, p, seed, mf_opt_str(m, "name")));
}

static int h_act(mf *m) {
  static const char *const names[] = {NULL, "relu", "tanh", "sigmoid", "softmax"};
  if (mf_need_input(m)) return -1;
  for (int i = 1; i < 5; i++)
    if (strcmp(m->kw, names[i]) == 0) return mf_built(m, pe_builder_act(m->b, m->x, (pe_b_act)i));
  return mf_fail(m, "internal: '%s' is not an activation", m->kw);
}

static int h_flatten(mf *m) {
  long axis = 1;
  if (mf_need_input(m) || mf_opt_long(m, "axis", 0, 7, &axis)) return -1;
  return mf_built(m, pe_builder_flatten(m->b, m->x, (int)axis));
}

/* --- branches: save, from, add --------------------------------------------------------- */

static const char **saved_slot(mf *m, const char *label) {
  for (int i = 0; i < m->n_saved; i++)
    if (!strcmp(m->saved[i].label, label)) return &m->saved[i].var;
  return NULL;
}

/* The variable saved as pos[0], or an error listing the labels. */
static const char *saved_var(mf *m) {
  const char **v = saved_slot(m, m->pos[0]);
  if (v) return *v;
  char known[256] = "";
  size_t k = 0;
  for (int i = 0; i < m->n_saved && k < sizeof known; i++)
    k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "", m->saved[i].label);
  mf_fail(m, "%s: no 'save %s' line before it (saved: %s)", m->kw, m->pos[0],
          m->n_saved ? known : "none");
  return NULL;
}

/* save LABEL: remember the current variable (a later save of the label
 * replaces it, so a block can be repeated as it is). */
static int h_save(mf *m) {
  if (mf_need_input(m)) return -1;
  const char *label = m->pos[0];
  size_t n = strlen(label);
  static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";
  if (n == 0 || n >= sizeof m->saved[0].label || strspn(label, ok) != n)
    return mf_fail(m, "save: label '%s' must be 1 to %zu letters, digits or '_'", label,
                   sizeof m->saved[0].label - 1);
  const char **v = saved_slot(m, label);
  if (!v) {
    if (m->n_saved == (int)(sizeof m->saved / sizeof m->saved[0]))
      return mf_fail(m, "save: more than %d labels", m->n_saved);
    snprintf(m->saved[m->n_saved].label, sizeof m->saved[0].label, "%s", label);
    v = &m->saved[m->n_saved++].var;
  }
  *v = m->x;
  return 0;
}

/* from LABEL: the saved variable becomes the current one (a second branch). */
static int h_from(mf *m) {
  if (mf_need_input(m)) return -1;
  const char *v = saved_var(m);
  if (!v) return -1;
  m->x = v;
  return 0;
}

/* add LABEL [act=A]: current + saved (a residual sum). */
static int h_add(mf *m) {
  pe_b_act act = PE_B_ACT_NONE;
  if (mf_need_input(m) || opt_act(m, &act)) return -1;
  const char *v = saved_var(m);
  if (!v) return -1;
  return mf_built(m, pe_builder_add(m->b, m->x, v, act, mf_opt_str(m, "name")));
}

/* The [N, 1] class labels the loss and accuracy read. */
static const char *class_label(const mf *m) {
  return m->label_rows ? m->label_rows : m->label;
}

static int h_loss(mf *m) {
  if (mf_need_input(m)) return -1;
  if (!m->label) return mf_fail(m, "loss: no 'label' line before it");
  if (m->targets && mf_built(m, mf_seq_rows(m))) return -1;
  const char *per_example;
  if (strcmp(m->pos[0], "softmax_with_cross_entropy") == 0)
    per_example = pe_builder_softmax_with_cross_entropy(m->b, m->x, class_label(m), NULL);
  else if (strcmp(m->pos[0], "cross_entropy") == 0)
    per_example = pe_builder_cross_entropy(m->b, m->x, class_label(m));
  else
    return mf_fail(m,
                   "loss: unknown kind '%s' (known: softmax_with_cross_entropy, "
                   "cross_entropy)",
                   m->pos[0]);
  const char *logits = m->x;
  if (mf_built(m, per_example) || mf_built(m, pe_builder_mean(m->b, per_example))) return -1;
  m->loss = m->x;
  m->x = logits; /* accuracy reads the logits */
  return 0;
}

static int h_accuracy(mf *m) {
  long k = 1;
  if (!m->x) return mf_fail(m, "accuracy: no 'input' line before it");
  if (!m->label) return mf_fail(m, "accuracy: no 'label' line before it");
  if (m->acc) return mf_fail(m, "accuracy: a second accuracy line");
  if (m->targets && !m->label_rows)
    return mf_fail(m, "accuracy: per-position targets are scored after the 'loss' line");
  if (mf_opt_long(m, "top", 1, 1000, &k)) return -1;
  const char *logits = m->x;
  if (mf_built(m, pe_builder_accuracy(m->b, logits, class_label(m), (int)k))) return -1;
  m->acc = m->x;
  m->acc_top_k = (int)k;
  m->x = logits;
  return 0;
}

static int h_optimizer(mf *m) {
  const char *t = m->pos[0];
  if (m->opt_type[0]) return mf_fail(m, "optimizer: a second optimizer line");
  if (!pe_optimizer_kind(t))
    return mf_fail(m, "optimizer: unknown kind '%s' (known: " PE_OPTIMIZER_KINDS ")", t);
  m->lr = -1;
  m->mu = 0.9f;
  m->beta1 = 0.9f;
  m->beta2 = 0.999f;
  m->eps = 1e-8f;
  m->weight_decay = 0;
  m->clip_norm = 0;
  /* The builder's (and the daemon's) ranges: lr > 0, mu and the betas
   * < 1, epsilon > 0. */
  if (mf_opt_float_in(m, "lr", 0, 1e6f, OPEN_MIN, &m->lr)) return -1;
  if (opt_float(m, "weight_decay", 0, 1, &m->weight_decay)) return -1;
  if (opt_float(m, "clip_norm", 0, 1e6f, &m->clip_norm)) return -1;
  if (m->lr < 0) return mf_fail(m, "optimizer: no learning rate (lr=...)");
  if (!strcmp(t, "momentum") && mf_opt_float_in(m, "mu", 0, 1, OPEN_MAX, &m->mu)) return -1;
  if (!strncmp(t, "adam", 4) && (mf_opt_float_in(m, "beta1", 0, 1, OPEN_MAX, &m->beta1) ||
                                 mf_opt_float_in(m, "beta2", 0, 1, OPEN_MAX, &m->beta2) ||
                                 mf_opt_float_in(m, "epsilon", 0, 1, OPEN_MIN, &m->eps)))
    return -1;
  m->nesterov = mf_opt_flag(m, "nesterov");
  if (m->nesterov && strcmp(t, "momentum"))
    return mf_fail(m, "optimizer: nesterov applies to momentum only");
  m->no_decay_1d = mf_opt_flag(m, "no_decay_1d");
  if (m->no_decay_1d && m->weight_decay == 0 && strcmp(t, "adamw"))
    return mf_fail(m,
                   "optimizer: no_decay_1d exempts parameters from weight decay, but %s has "
                   "none (weight_decay=X)",
                   t);
  snprintf(m->opt_type, sizeof m->opt_type, "%s", t);
  return 0;
}

/* What each schedule kind takes and needs. The ranges are the daemon's
 * (pe_lr_params_check; proto/program.proto's LrSchedule), checked here so
 * that the errors carry the line: warmup >= 0; decay_steps >= 1; gamma in
 * (0, 1] (step and multistep: 0.1 when left out); min_lr in [0, lr);
 * milestones increasing, >= 1, at most 32. An option the kind does not use
 * is an error, not ignored. */
typedef struct sched_row {
  const char *kind, *takes, *needs, *why;
} sched_row;

static const sched_row sched_rows[] = {
    {"constant", "warmup", NULL, NULL},
    {"step", "warmup decay_steps gamma", "decay_steps", "the steps between decays"},
    {"multistep", "warmup gamma milestones", "milestones", "the steps to decay at"},
    {"exponential", "warmup decay_steps gamma", "gamma", "the factor per decay_steps steps"},
    {"cosine", "warmup decay_steps min_lr", "decay_steps", "the steps from lr to min_lr"},
    {"linear", "warmup decay_steps min_lr", "decay_steps", "the steps from lr to min_lr"},
};

/* Is word one of the blank-separated words of list? */
static bool has_word(const char *list, const char *word) {
  size_t n = strlen(word);
  for (const char *p = strstr(list, word); p; p = strstr(p + 1, word))
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || !p[n])) return true;
  return false;
}

static int h_schedule(mf *m) {
  const char *t = m->pos[0];
  if (m->sched_line) return mf_fail(m, "schedule: a second schedule line");
  const sched_row *row = NULL;
  for (size_t i = 0; i < sizeof sched_rows / sizeof sched_rows[0]; i++)
    if (!strcmp(sched_rows[i].kind, t)) row = &sched_rows[i];
  if (!row) return mf_fail(m, "schedule: unknown kind '%s' (known: " PE_LR_SCHEDULE_KINDS ")", t);
  for (int i = 0; i < m->n_opts; i++)
    if (!has_word(row->takes, m->opts[i].key))
      return mf_fail(m, "schedule %s: option '%s' does not apply (%s takes: %s)", t, m->opts[i].key,
                     t, row->takes);
  if (row->needs && !mf_opt_str(m, row->needs))
    return mf_fail(m, "schedule %s: no %s=... (%s)", t, row->needs, row->why);
  m->warmup = m->decay_steps = 0;
  m->gamma = m->min_lr = 0;
  m->n_milestones = 0;
  if (mf_opt_long(m, "warmup", 0, 1L << 62, &m->warmup) ||
      mf_opt_long(m, "decay_steps", 1, 1L << 62, &m->decay_steps) ||
      opt_float(m, "min_lr", 0, 1e6f, &m->min_lr) ||
      opt_long_list(m, "milestones", 1, 1L << 62, m->milestones, PE_B_MAX_MILESTONES,
                    &m->n_milestones))
    return -1;
  /* gamma 0 is the wire's "unset" (step, multistep: 0.1): written out, it
   * is a mistake. */
  const char *g = mf_opt_str(m, "gamma");
  if (g) {
    char *end;
    m->gamma = strtof(g, &end);
    if (end == g || *end || !(m->gamma > 0 && m->gamma <= 1))
      return mf_fail(m, "schedule %s: gamma '%s' is not a number in (0, 1]%s", t, g,
                     strcmp(t, "exponential") ? " (left out: 0.1)" : "");
  }
  for (int i = 1; i < m->n_milestones; i++)
    if (m->milestones[i] <= m->milestones[i - 1])
      return mf_fail(m, "schedule multistep: milestones '%s' do not increase (%lld after %lld)",
                     mf_opt_str(m, "milestones"), (long long)m->milestones[i],
                     (long long)m->milestones[i - 1]);
  snprintf(m->sched_type, sizeof m->sched_type, "%s", t);
  m->sched_line = m->line;
  return 0;
}

/* --- the table ------------------------------------------------------------------------ */

typedef struct mf_row {
  const char *kw;
  int min_pos, max_pos;
  const char *opts; /* space separated; "key=" takes a value, "key" is a flag */
  int (*fn)(mf *m);
  const char *usage;
} mf_row;

static const mf_row rows[] = {
    {"name", 1, 1, "", h_name, "name NAME"},
    {"batch", 1, 1, "", h_batch, "batch N"},
    {"input", 1, 4, "", h_input, "input NAME [DIM...]"},
    {"label", 1, 1, "", h_label, "label NAME"},
    {"tokens", 2, 2, "", mf_h_tokens, "tokens NAME T"},
    {"targets", 2, 2, "", mf_h_targets, "targets NAME T"},
    {"fc", 1, 1, "act= name= no_bias num_col_dims=", h_fc, "fc SIZE [act=A]"},
    {"conv2d", 2, 2, "stride= pad= dilation= groups= act= name= no_bias", h_conv2d,
     "conv2d OUT K[xK] [stride=S] [pad=P] [act=A]"},
    {"pool2d", 1, 2, "stride= pad= global inclusive name=", h_pool2d,
     "pool2d max|avg K[xK] [stride=S] [pad=P]"},
    {"batch_norm", 0, 0, "momentum= epsilon= act= name=", h_batch_norm, "batch_norm [act=A]"},
    {"dropout", 1, 1, "seed= name=", h_dropout, "dropout P"},
    {"relu", 0, 0, "", h_act, "relu"},
    {"tanh", 0, 0, "", h_act, "tanh"},
    {"sigmoid", 0, 0, "", h_act, "sigmoid"},
    {"softmax", 0, 0, "", h_act, "softmax"},
    {"flatten", 0, 0, "axis=", h_flatten, "flatten [axis=N]"},
    {"embedding", 2, 2, "padding_idx= sparse name=", mf_h_embedding,
     "embedding VOCAB DIM [padding_idx=N] [sparse] [name=S]"},
    {"pos_embedding", 0, 0, "name=", mf_h_pos_embedding, "pos_embedding [name=S]"},
    {"layer_norm", 0, 0, "begin_norm_axis= epsilon= name=", mf_h_layer_norm,
     "layer_norm [begin_norm_axis=N] [epsilon=E] [name=S]"},
    {"gelu", 0, 0, "approximate", mf_h_gelu, "gelu [approximate]"},
    {"attention", 1, 1, "causal name=", mf_h_attention, "attention HEADS [causal] [name=S]"},
    {"transformer_block", 2, 2, "causal name=", mf_h_transformer_block,
     "transformer_block HEADS FFN_DIM [causal] [name=S]"},
    {"save", 1, 1, "", h_save, "save LABEL"},
    {"from", 1, 1, "", h_from, "from LABEL"},
    {"add", 1, 1, "act= name=", h_add, "add LABEL [act=A]"},
    {"loss", 1, 1, "", h_loss, "loss softmax_with_cross_entropy|cross_entropy"},
    {"accuracy", 0, 0, "top=", h_accuracy, "accuracy [top=K]"},
    {"optimizer", 1, 1,
     "lr= mu= nesterov beta1= beta2= epsilon= weight_decay= no_decay_1d clip_norm=", h_optimizer,
     "optimizer sgd|momentum|adam|adamw lr=X [mu=X] [nesterov] [beta1=X beta2=X epsilon=X] "
     "[weight_decay=X] [no_decay_1d] [clip_norm=X]"},
    {"schedule", 1, 1, "warmup= decay_steps= gamma= min_lr= milestones=", h_schedule,
     "schedule constant|step|multistep|exponential|cosine|linear [warmup=N] [decay_steps=N] "
     "[gamma=X] [min_lr=X] [milestones=A,B,C]"},
};
#define N_ROWS (sizeof rows / sizeof rows[0])

/* Is `key` (a flag when !has_val) among the row's options? */
static bool row_allows(const mf_row *r, const char *key, bool has_val) {
  size_t kl = strlen(key);
  for (const char *p = r->opts; *p;) {
    while (*p == ' ') p++;
    const char *e = p;
    while (*e && *e != ' ') e++;
    size_t n = (size_t)(e - p);
    bool val = n && p[n - 1] == '=';
    if ((val ? n - 1 : n) == kl && strncmp(p, key, kl) == 0 && val == has_val) return true;
    p = e;
  }
  return false;
}

static int unknown_keyword(mf *m, const char *kw) {
  char known[512];
  size_t k = 0;
  for (size_t i = 0; i < N_ROWS && k < sizeof known; i++)
    k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "", rows[i].kw);
  return mf_fail(m, "unknown layer '%s' (known: %s)", kw, known);
}

static int parse_line(mf *m, char *line) {
  char *hash = strchr(line, '#');
  if (hash) *hash = 0;
  char *tok[MAX_TOKENS + 1];
  int n = 0;
  for (char *save = NULL, *t = strtok_r(line, " \t\r", &save); t;
       t = strtok_r(NULL, " \t\r", &save)) {
    if (n == MAX_TOKENS) return mf_fail(m, "more than %d words on a line", MAX_TOKENS);
    tok[n++] = t;
  }
  if (n == 0) return 0;
  const mf_row *r = NULL;
  for (size_t i = 0; i < N_ROWS; i++)
    if (strcmp(rows[i].kw, tok[0]) == 0) r = &rows[i];
  if (!r) return unknown_keyword(m, tok[0]);
  m->kw = r->kw;
  m->n_pos = m->n_opts = 0;
  for (int i = 1; i < n; i++) {
    char *eq = strchr(tok[i], '=');
    if (eq) {
      *eq = 0;
      if (!row_allows(r, tok[i], true) && row_allows(r, tok[i], false))
        return mf_fail(m, "%s: option '%s' takes no value (usage: %s)", r->kw, tok[i], r->usage);
      if (!row_allows(r, tok[i], true))
        return mf_fail(m, "%s: unknown option '%s' (usage: %s)", r->kw, tok[i], r->usage);
      if (!eq[1]) return mf_fail(m, "%s: option '%s' has no value", r->kw, tok[i]);
      m->opts[m->n_opts++] = (mf_opt){tok[i], eq + 1, false};
    } else if (row_allows(r, tok[i], false)) {
      m->opts[m->n_opts++] = (mf_opt){tok[i], NULL, false};
    } else {
      m->pos[m->n_pos++] = tok[i];
    }
  }
  if (m->n_pos < r->min_pos || m->n_pos > r->max_pos) {
    if (r->min_pos == r->max_pos)
      return mf_fail(m, "%s: %d argument(s), expected %d (usage: %s)", r->kw, m->n_pos, r->min_pos,
                     r->usage);
    return mf_fail(m, "%s: %d argument(s), expected %d to %d (usage: %s)", r->kw, m->n_pos,
                   r->min_pos, r->max_pos, r->usage);
  }
  for (int i = 0; i < m->n_opts; i++)
    for (int j = 0; j < i; j++)
      if (strcmp(m->opts[i].key, m->opts[j].key) == 0)
        return mf_fail(m, "%s: option '%s' given twice", r->kw, m->opts[i].key);
  if (r->fn(m)) return -1;
  for (int i = 0; i < m->n_opts; i++)
    if (!m->opts[i].used)
      return mf_fail(m, "%s: option '%s' does not apply here (usage: %s)", r->kw, m->opts[i].key,
                     r->usage);
  return 0;
}

/* End of file: the loss, backward mark and optimizer; then serialise. */
static int finish(mf *m, const pe_model_opts *o, pe_model_spec *out) {
  m->line = 0;
  m->kw = "end of file";
  if (!m->image) return mf_fail(m, "no 'input' line");
  if (!m->label) return mf_fail(m, "no 'label' line");
  if (!m->loss) return mf_fail(m, "no 'loss' line");
  if (!m->acc) return mf_fail(m, "no 'accuracy' line");
  if (m->sched_line) {
    /* the schedule's errors carry its line */
    m->line = m->sched_line;
    m->kw = "schedule";
    if (!m->opt_type[0])
      return mf_fail(m, "schedule: no 'optimizer' line (a schedule needs an optimizer)");
    /* min_lr below the optimizer's lr (known only now: either line may
     * come first). */
    if ((!strcmp(m->sched_type, "cosine") || !strcmp(m->sched_type, "linear")) &&
        !(m->min_lr < m->lr))
      return mf_fail(m, "schedule %s: min_lr %g must be below the optimizer's lr %g", m->sched_type,
                     m->min_lr, m->lr);
    pe_lr_schedule_opts so = {.type = m->sched_type,
                              .warmup_steps = m->warmup,
                              .decay_steps = m->decay_steps,
                              .gamma = m->gamma,
                              .min_lr = m->min_lr,
                              .n_milestones = m->n_milestones,
                              .milestones = m->milestones};
    if (pe_builder_lr_schedule(m->b, &so))
      return mf_fail(m, "schedule: %s", pe_builder_error(m->b));
    m->line = 0;
    m->kw = "end of file";
  }
  int rc = pe_builder_append_backward(m->b, m->loss);
  if (!rc && m->weight_decay > 0) rc = pe_builder_weight_decay(m->b, m->weight_decay);
  if (!rc && m->clip_norm > 0) rc = pe_builder_grad_clip_norm(m->b, m->clip_norm);
  if (!rc && !strcmp(m->opt_type, "sgd")) rc = pe_builder_sgd(m->b, m->lr);
  if (!rc && !strcmp(m->opt_type, "momentum"))
    rc = pe_builder_momentum(m->b, m->lr, m->mu, m->nesterov);
  if (!rc && !strcmp(m->opt_type, "adam"))
    rc = pe_builder_adam(m->b, m->lr, m->beta1, m->beta2, m->eps);
  if (!rc && !strcmp(m->opt_type, "adamw"))
    rc = pe_builder_adamw(m->b, m->lr, m->beta1, m->beta2, m->eps);
  if (!rc && m->no_decay_1d) rc = pe_builder_no_weight_decay_1d(m->b);
  if (rc) return mf_fail(m, "%s", pe_builder_error(m->b));
  snprintf(out->name, sizeof out->name, "%s", m->name);
  snprintf(out->image, sizeof out->image, "%s", m->image);
  snprintf(out->label, sizeof out->label, "%s", m->label);
  snprintf(out->loss, sizeof out->loss, "%s", m->loss);
  snprintf(out->accuracy, sizeof out->accuracy, "%s", m->acc);
  /* the accuracy layer's outputs are "<layer>.out" / ".correct" (pe_builder.h) */
  snprintf(out->correct, sizeof out->correct, "%.*s.correct",
           (int)(strlen(m->acc) - strlen(".out")), m->acc);
  out->image_ndim = m->image_ndim;
  out->image_dtype = m->tokens ? PE_B_I64 : PE_B_F32;
  out->label_len = m->targets ? m->seq_len : 0;
  memcpy(out->image_dims, m->image_dims, sizeof out->image_dims);
  out->default_batch = m->batch ? m->batch : 64;
  out->accuracy_top_k = m->acc_top_k;
  char msg[512];
  if (pec_model_finish(m->b, o, out, msg, sizeof msg)) return mf_fail(m, "%s", msg);
  return 0;
}

int pec_model_file_parse(const char *text, size_t len, const char *source, const pe_model_opts *o,
                         pe_model_spec *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  mf m = {.source = source && *source ? source : "model", .err = err, .errlen = errlen};
  snprintf(m.name, sizeof m.name, "%s", m.source);
  m.b = pe_builder_new();
  if (!m.b) return mf_fail(&m, "out of memory");
  char line[MAX_LINE + 1];
  size_t i = 0;
  /* A UTF-8 byte order mark (some editors write one) is not text. */
  if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3)) i = 3;
  while (i < len && !m.failed) {
    m.line++;
    size_t j = i;
    while (j < len && text[j] != '\n') j++;
    if (j - i > MAX_LINE) {
      mf_fail(&m, "line longer than %d bytes", MAX_LINE);
      break;
    }
    memcpy(line, text + i, j - i);
    line[j - i] = 0;
    if (memchr(line, 0, j - i)) {
      mf_fail(&m, "a NUL byte (not a text file?)");
      break;
    }
    parse_line(&m, line);
    i = j + 1;
  }
  if (!m.failed) finish(&m, o, out);
  pe_builder_free(m.b);
  if (m.failed) {
    pe_model_spec_release(out);
    return -1;
  }
  return 0;
}

int pe_model_file_parse(const char *text, size_t len, const char *source, pe_model_spec *out,
                        char *err, size_t errlen) {
  return pec_model_file_parse(text, len, source, NULL, out, err, errlen);
}
