/* The convolution algorithm chooser (contract in conv_algo.h). */
#include "conv_algo.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

static const char *const cand_names[PE_CONV_CANDS] = {"direct", "gemm", "winograd", "auto"};

const char *pe_conv_cand_name(int cand) {
  return cand >= 0 && cand < PE_CONV_CANDS ? cand_names[cand] : NULL;
}

bool pe_conv_algo_parse(const char *s, int *mode) {
  if (!strcmp(s, "time") || !strcmp(s, "default")) {
    *mode = s[0] == 't' ? PE_CONV_ALGO_TIME : PE_CONV_ALGO_DEFAULT;
    return true;
  }
  for (int i = 0; i < PE_CONV_CANDS; i++)
    if (!strcmp(s, cand_names[i])) {
      *mode = i;
      return true;
    }
  return false;
}

static atomic_int algo_mode = PE_CONV_ALGO_DEFAULT;

void pe_conv_algo_set_mode(int mode) {
  atomic_store(&algo_mode, mode);
}

int pe_conv_algo_get_mode(void) {
  return atomic_load(&algo_mode);
}

int pe_conv_algo_choose(const double *times, int n) {
  int best = -1;
  for (int i = 0; i < n; i++) {
    if (!(times[i] >= 0)) continue; /* absent (negative) or NaN */
    if (best < 0 || times[i] < times[best]) best = i;
  }
  return best;
}

/* A process sees a handful of convolution configurations (a few per model
 * and batch size); past the table's size a choice is used but not kept. */
#define MEMO_SIZE 256

typedef struct memo_entry {
  int nkey;
  int cand;
  int64_t key[PE_CONV_ALGO_KEY_MAX];
} memo_entry;

static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
static memo_entry memo[MEMO_SIZE];
static int memo_n;

static int memo_find(const int64_t *key, int nkey) {
  for (int i = 0; i < memo_n; i++)
    if (memo[i].nkey == nkey && !memcmp(memo[i].key, key, (size_t)nkey * sizeof *key))
      return memo[i].cand;
  return -1;
}

int pe_conv_algo_lookup(const int64_t *key, int nkey) {
  pthread_mutex_lock(&memo_lock);
  int cand = memo_find(key, nkey);
  pthread_mutex_unlock(&memo_lock);
  return cand;
}

int pe_conv_algo_remember(const int64_t *key, int nkey, int cand) {
  if (nkey > PE_CONV_ALGO_KEY_MAX) return cand;
  pthread_mutex_lock(&memo_lock);
  int had = memo_find(key, nkey);
  if (had >= 0) {
    cand = had;
  } else if (memo_n < MEMO_SIZE) {
    memo_entry *m = &memo[memo_n++];
    m->nkey = nkey;
    m->cand = cand;
    memcpy(m->key, key, (size_t)nkey * sizeof *key);
  }
  pthread_mutex_unlock(&memo_lock);
  return cand;
}
