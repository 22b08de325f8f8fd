/* libpe-kernel-times.so: the GPU time of every kernel a program runs, by
 * kernel name, through CUPTI's activity API, for a machine without Nsight
 * Systems (the lent GPU machines have CUPTI in PyTorch's wheels, no nsys).
 *
 *   LD_PRELOAD=libpe-kernel-times.so PE_KERNEL_TIMES=FILE pe-bench train ...
 *
 * At exit FILE (stderr when unset or "-") gets one line per kernel name,
 * the largest total first: total ms, launches, mean us, share of all
 * kernel time, the name; then memcpy/memset totals. Kernels replayed from
 * a CUDA graph are recorded like launched ones.
 *
 * Threads: CUPTI calls buffer_done on its own thread; the table is under
 * a mutex. Nothing here runs unless the library is preloaded. */
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES (8u << 20)
#define MAX_NAMES 4096

typedef struct entry {
  char *name;
  uint64_t ns, n;
} entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry table[MAX_NAMES];
static int n_names;
static uint64_t copy_ns, copy_n, set_ns, set_n, dropped;

/* Under mu. Names are CUPTI's strings, valid for the process. */
static void add(const char *name, uint64_t ns) {
  for (int i = 0; i < n_names; i++)
    if (table[i].name == name || strcmp(table[i].name, name) == 0) {
      table[i].ns += ns;
      table[i].n++;
      return;
    }
  if (n_names == MAX_NAMES) {
    dropped++;
    return;
  }
  table[n_names++] = (entry){strdup(name), ns, 1};
}

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
  *buf = aligned_alloc(8, BUF_BYTES);
  *size = *buf ? BUF_BYTES : 0;
  *max_records = 0;
}

static void CUPTIAPI buffer_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                 size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity *rec = NULL;
  pthread_mutex_lock(&mu);
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
      add(k->name ? k->name : "?", k->end - k->start);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
      copy_ns += m->end - m->start;
      copy_n++;
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
      set_ns += m->end - m->start;
      set_n++;
    }
  }
  pthread_mutex_unlock(&mu);
  free(buf);
}

static int by_total(const void *a, const void *b) {
  const entry *x = a, *y = b;
  return (x->ns < y->ns) - (x->ns > y->ns);
}

__attribute__((constructor)) static void start(void) {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_done) != CUPTI_SUCCESS) {
    fprintf(stderr, "pe-kernel-times: CUPTI callbacks refused; nothing is recorded\n");
    return;
  }
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
}

__attribute__((destructor)) static void report(void) {
  cuptiActivityFlushAll(1);
  const char *path = getenv("PE_KERNEL_TIMES");
  FILE *f = path && strcmp(path, "-") ? fopen(path, "w") : stderr;
  if (!f) f = stderr;
  pthread_mutex_lock(&mu);
  qsort(table, (size_t)n_names, sizeof *table, by_total);
  uint64_t all = 0, launches = 0;
  for (int i = 0; i < n_names; i++) all += table[i].ns, launches += table[i].n;
  fprintf(f, "kernels: %.3f ms in %llu launches of %d kernels\n", all / 1e6,
          (unsigned long long)launches, n_names);
  fprintf(f, "%10s %9s %9s %6s  %s\n", "total_ms", "launches", "mean_us", "share", "kernel");
  for (int i = 0; i < n_names; i++)
    fprintf(f, "%10.3f %9llu %9.2f %5.1f%%  %.160s\n", table[i].ns / 1e6,
            (unsigned long long)table[i].n, table[i].ns / 1e3 / (double)table[i].n,
            all ? 100.0 * (double)table[i].ns / (double)all : 0.0, table[i].name);
  fprintf(f, "memcpy: %.3f ms in %llu; memset: %.3f ms in %llu; names dropped: %llu\n",
          copy_ns / 1e6, (unsigned long long)copy_n, set_ns / 1e6, (unsigned long long)set_n,
          (unsigned long long)dropped);
  pthread_mutex_unlock(&mu);
  if (f != stderr) fclose(f);
}
