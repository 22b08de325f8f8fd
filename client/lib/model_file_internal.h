/* Internals of the model-file parser shared by model_file.c (the keyword
 * table, the line reader, the image and training words) and
 * model_file_seq.c (the sequence-model words). Not installed. */
#ifndef PE_CLIENT_MODEL_FILE_INTERNAL_H
#define PE_CLIENT_MODEL_FILE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "model_internal.h"
#include "pe_builder.h"

#define MAX_TOKENS 24

typedef struct mf_opt {
  const char *key, *val; /* val NULL: a flag */
  bool used;
} mf_opt;

typedef struct mf {
  pe_builder *b;
  const char *source;
  int line;
  char *err;
  size_t errlen;
  bool failed;
  char name[PE_MODEL_NAME_LEN];
  int batch;
  const char *x; /* current variable */
  /* `save` labels: variables a later `from` or `add` reads (branches and
   * residual sums); names point into the builder. */
  struct {
    char label[32];
    const char *var;
  } saved[32];
  int n_saved;
  const char *image, *label, *loss, *acc;
  /* sequence models: `tokens` (the image is i64 [-1, T]), `targets` (the
   * label is i64 [-1, T]: one class per position) and the causal mask the
   * attention lines share (made at the first `causal`) */
  bool tokens, targets;
  int64_t seq_len;
  const char *causal_mask;
  const char *label_rows; /* the targets as rows [B*T, 1], made by the loss line */
  int acc_top_k;          /* the accuracy line's top=K */
  int image_ndim;
  int64_t image_dims[4];
  const char *kw; /* keyword of the line being parsed */
  const char *pos[MAX_TOKENS];
  int n_pos;
  mf_opt opts[MAX_TOKENS];
  int n_opts;
  /* optimizer, applied at the end */
  char opt_type[16];
  float lr, mu, beta1, beta2, eps, weight_decay, clip_norm;
  bool nesterov, no_decay_1d;
  /* schedule, applied at the end; sched_line 0: none */
  int sched_line;
  int name_line; /* the `name` line; 0: none yet */
  char sched_type[16];
  long warmup, decay_steps;
  float gamma, min_lr;
  int n_milestones;
  int64_t milestones[PE_B_MAX_MILESTONES];
} mf;

/* Which ends of a number's range are open (excluded): the daemon's ranges
 * (a learning rate > 0, beta < 1), said as the interval they are. */
enum { CLOSED = 0, OPEN_MIN = 1, OPEN_MAX = 2 };

/* The argument readers (model_file.c): each fails with the line's keyword,
 * the option and its range; -1 after an error. */
int mf_fail(mf *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *mf_opt_str(mf *m, const char *key);
bool mf_opt_flag(mf *m, const char *key);
int mf_parse_long(mf *m, const char *what, const char *s, long min, long max, long *out);
int mf_opt_long(mf *m, const char *key, long min, long max, long *out);
int mf_opt_float_in(mf *m, const char *key, float min, float max, int open, float *out);
int mf_need_input(mf *m);
int mf_built(mf *m, const char *out);

/* The sequence-model words (model_file_seq.c). */
int mf_h_tokens(mf *m);
int mf_h_targets(mf *m);
int mf_h_embedding(mf *m);
int mf_h_pos_embedding(mf *m);
int mf_h_layer_norm(mf *m);
int mf_h_gelu(mf *m);
int mf_h_attention(mf *m);
int mf_h_transformer_block(mf *m);
const char *mf_seq_rows(mf *m);

#endif
