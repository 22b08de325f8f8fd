/* The convolution algorithm of conv2d and conv2d_grad, chosen per shape by
 * timing the candidates on the first call.
 *
 * Why. Which oneDNN convolution is fastest depends on the ISA and the shape:
 * the direct JIT kernels on blocked layouts (plus the reorders to and from
 * them), Winograd (3x3 filters on AVX-512 only; creating its primitive
 * descriptor fails elsewhere), oneDNN's own pick (auto), or im2col + GEMM on
 * the plain tensors (no reorders at all; wins where the channels are few).
 * A fixed choice loses on some machine; timing the candidates costs a few
 * extra passes on the first call of each shape.
 *
 * Team. Each candidate is also timed on one thread where the place's
 * intra-op team has more: a convolution too small to gain from a second
 * thread loses to the team's fork and join (a woken passive thread costs
 * tens of microseconds), and the measured time, not a FLOP threshold, says
 * where that is on this machine. A choice is a candidate on the whole team
 * or, PE_CONV_CANDS higher, the same candidate on one thread.
 *
 * Determinism. The first op instance that meets a configuration (shapes,
 * attributes, direction, intra-op threads) times the candidates; the choice
 * is kept process-wide, so every instance of that configuration (other
 * places' replicas, a program registered again) runs the same algorithm
 * and rounds the same way. A new process may choose otherwise where two
 * candidates time alike, so the default (pe-executord.conf's `conv_algo`)
 * is a fixed rule: pe's own Winograd (conv_winograd.h) where it applies,
 * direct elsewhere. Runs stay bitwise reproducible across processes on one
 * machine, and no process pays the timing passes unless it asks for them.
 *
 * Threading: the mode is set once at start-up, before kernels run; the
 * choice table is shared by all kernel threads under a lock. */
#ifndef PE_OPS_CPU_CONV_ALGO_H
#define PE_OPS_CPU_CONV_ALGO_H

#include <stdbool.h>
#include <stdint.h>

/* The candidates, in the order ties are broken (the first wins). */
typedef enum pe_conv_cand {
  PE_CONV_DIRECT,   /* dnnl_convolution_direct, layouts chosen by oneDNN (staged) */
  PE_CONV_GEMM,     /* dnnl_convolution_direct on the plain tensors (im2col + GEMM) */
  PE_CONV_WINOGRAD, /* pe's F(2x2, 5x5) or F(4x4, 3x3) where it applies (conv_winograd.h), else
                     * dnnl_convolution_winograd where a primitive exists */
  PE_CONV_AUTO,     /* dnnl_convolution_auto */
  PE_CONV_CANDS
} pe_conv_cand;

/* Choices: candidates on the place's team, then on one thread. */
#define PE_CONV_CHOICES (2 * PE_CONV_CANDS)
static inline int pe_conv_choice_cand(int choice) {
  return choice % PE_CONV_CANDS;
}
static inline bool pe_conv_choice_single(int choice) {
  return choice >= PE_CONV_CANDS;
}

typedef enum pe_conv_algo_mode {
  PE_CONV_ALGO_DEFAULT = -2, /* pe's Winograd where it applies, else direct */
  PE_CONV_ALGO_TIME = -1,    /* time the candidates */
  /* >= 0: always that choice (a pe_conv_cand, on the place's team; the
   * same + PE_CONV_CANDS, on one thread). A Winograd that does not exist
   * for the shape falls back to direct. */
} pe_conv_algo_mode;

/* "direct", "gemm", "winograd", "auto"; NULL for an invalid index. */
const char *pe_conv_cand_name(int cand);
/* Parse a mode: "default", "time" or a candidate's name. False for
 * anything else. */
bool pe_conv_algo_parse(const char *s, int *mode);
/* The process-wide mode (PE_CONV_ALGO_DEFAULT until set). */
void pe_conv_algo_set_mode(int mode);
int pe_conv_algo_get_mode(void);

/* The candidate with the smallest time; times[i] < 0 (or NaN) marks a
 * candidate that does not exist. Equal times go to the lower index. -1 when
 * none exists. */
int pe_conv_algo_choose(const double *times, int n);

/* The process-wide memo of choices: key -> choice. lookup returns -1
 * when the key has no choice yet; remember keeps the first choice made for
 * a key (two instances timing at once agree on the first) and returns it. */
#define PE_CONV_ALGO_KEY_MAX 32
int pe_conv_algo_lookup(const int64_t *key, int nkey);
int pe_conv_algo_remember(const int64_t *key, int nkey, int cand);

#endif
