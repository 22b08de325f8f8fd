/* Captured steps' keys and their cache (engine/step_graph_key.h). */
#include "engine/step_graph_key.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/registry.h"

/* --- the option ------------------------------------------------------------- */

static const char *const mode_names[] = {"auto", "on", "off"};

bool pe_cuda_graph_mode_parse(const char *s, pe_cuda_graph_mode *out) {
  for (int i = 0; s && i < 3; i++)
    if (!strcmp(s, mode_names[i])) {
      *out = (pe_cuda_graph_mode)i;
      return true;
    }
  return false;
}

const char *pe_cuda_graph_mode_name(pe_cuda_graph_mode m) {
  return (unsigned)m < 3 ? mode_names[m] : "?";
}

bool pe_cuda_graph_decide(pe_cuda_graph_mode mode, pe_place_kind kind, int n_places, bool backend,
                          const char **reason) {
  const char *why = NULL;
  if (mode == PE_CUDA_GRAPH_OFF)
    why = "off by option";
  else if (kind != PE_PLACE_CUDA)
    why = "no cuda place";
  else if (!backend)
    why = "this build has no cuda backend";
  else if (mode == PE_CUDA_GRAPH_AUTO && n_places > 1)
    why =
        "NCCL inside a captured step has not run on two GPUs (auto captures steps on one cuda "
        "place; on forces it)";
  *reason = why;
  return why == NULL;
}

/* --- what a captured step can hold ------------------------------------------ */

bool pe_step_graph_run_capturable(const pe_step_graph_run *r, const char **why) {
  const char *w = NULL;
  if (r->check_nan_inf)
    w = "check_nan_inf checks every op's outputs on the host";
  else if (r->timeline)
    w = "a timeline records every node's span on the host";
  else if (r->test_hooks)
    w = "node hooks (node_hook, delay_us, skip) run on the host between nodes";
  else if (r->cross_nodes)
    w = "gradients are summed across nodes on the host";
  else if (r->producer_sync)
    w = "the run's sync strategy waits on producer streams, which a replay leaves empty";
  *why = w;
  return w == NULL;
}

/* Kept in step with the kernels that take the delta (cuda/kernels.h). */
static const char *const counted_rng[] = {"dropout", "uniform_random", "gaussian_random", NULL};

bool pe_step_graph_rng_op_counted(const char *type) {
  for (int i = 0; counted_rng[i]; i++)
    if (!strcmp(type, counted_rng[i])) return true;
  return false;
}

bool pe_step_graph_op_capturable(const char *type, unsigned op_flags, const char **why) {
  *why = NULL;
  if ((op_flags & PE_OP_RANDOM) && !pe_step_graph_rng_op_counted(type))
    *why =
        "it draws random numbers with its counter offset as a kernel argument, which every "
        "replay would repeat";
  return *why == NULL;
}

bool pe_step_graph_rng_capturable(bool has_gaussian, uint64_t counters, const char **why) {
  *why = NULL;
  if (has_gaussian && (counters & 1))
    *why =
        "gaussian_random's counter pairs depend on the offset's parity and the step draws an odd "
        "number of counters";
  return *why == NULL;
}

bool pe_step_graph_buffers_moved(const void *const *then, const void *const *now, int n) {
  for (int i = 0; i < n; i++)
    if (then[i] != now[i]) return true;
  return false;
}

/* --- the key ------------------------------------------------------------------ */

/* FNV-1a, 64 bits: the quick test before the byte compare. */
static uint64_t fnv1a(const uint8_t *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* The bytes go through a memory stream (open_memstream grows the buffer). */
static void put(pe_step_key *k, const void *p, size_t n) {
  if (!k->w || fwrite(p, 1, n, k->w) != n) k->oom = true;
}

static void put_i64(pe_step_key *k, int64_t v) {
  put(k, &v, sizeof v);
}

/* Strings with their terminator: "ab"+"c" and "a"+"bc" differ. */
static void put_str(pe_step_key *k, const char *s) {
  put(k, s, strlen(s) + 1);
}

/* Section tags keep a feed list and a fetch list from ever reading alike. */
enum { TAG_FEED = 'F', TAG_FETCHES = 'R' };

void pe_step_key_init(pe_step_key *k, uint64_t program, pe_place_kind kind, int n_places) {
  memset(k, 0, sizeof *k);
  k->w = open_memstream((char **)&k->bytes, &k->len);
  put_i64(k, (int64_t)program);
  put_i64(k, kind);
  put_i64(k, n_places);
}

void pe_step_key_feed(pe_step_key *k, const char *name, int dtype, const int64_t *dims, int ndim) {
  put_i64(k, TAG_FEED);
  put_str(k, name);
  put_i64(k, dtype);
  put_i64(k, ndim);
  for (int i = 0; i < ndim; i++) put_i64(k, dims[i]);
}

void pe_step_key_fetches(pe_step_key *k, const char *const *names, int n) {
  put_i64(k, TAG_FETCHES);
  put_i64(k, n);
  for (int i = 0; i < n; i++) put_str(k, names[i]);
}

pe_status *pe_step_key_done(pe_step_key *k) {
  if (k->w && fclose(k->w)) k->oom = true;
  k->w = NULL;
  if (k->oom || !k->bytes)
    return pe_error(PE_ENOMEM, "captured step: out of memory building its key");
  k->hash = fnv1a(k->bytes, k->len);
  return NULL;
}

bool pe_step_key_equal(const pe_step_key *a, const pe_step_key *b) {
  return a->hash == b->hash && a->len == b->len && !memcmp(a->bytes, b->bytes, a->len);
}

void pe_step_key_release(pe_step_key *k) {
  if (k->w) fclose(k->w);
  free(k->bytes);
  memset(k, 0, sizeof *k);
}

/* --- the cache ------------------------------------------------------------------ */

typedef struct entry {
  pe_step_key key;
  int steps;     /* steps seen since the entry was made */
  void *graph;   /* stored capture (owned), or NULL */
  char *refused; /* why the key falls back, or NULL */
  uint64_t last; /* use clock, for eviction */
} entry;

struct pe_step_graphs {
  entry *e;
  int n, max;
  uint64_t clock;
  pe_step_graph_free_fn free_graph;
  pe_step_graph_stats st;
  char *last_reason; /* owned copy of the last refusal */
};

pe_status *pe_step_graphs_new(int max_keys, pe_step_graph_free_fn free_graph,
                              pe_step_graphs **out) {
  if (max_keys < 1)
    return pe_error(PE_EINVAL, "captured steps: max_keys %d must be at least 1", max_keys);
  pe_step_graphs *c = calloc(1, sizeof *c);
  if (c) c->e = calloc((size_t)max_keys, sizeof *c->e);
  if (!c || !c->e) {
    free(c);
    return pe_error(PE_ENOMEM, "captured steps: out of memory for %d keys", max_keys);
  }
  c->max = max_keys;
  c->free_graph = free_graph;
  *out = c;
  return NULL;
}

static void entry_clear(pe_step_graphs *c, entry *x) {
  if (x->graph && c->free_graph) c->free_graph(x->graph);
  pe_step_key_release(&x->key);
  free(x->refused);
  memset(x, 0, sizeof *x);
}

void pe_step_graphs_free(pe_step_graphs *c) {
  if (!c) return;
  for (int i = 0; i < c->n; i++) entry_clear(c, &c->e[i]);
  free(c->e);
  free(c->last_reason);
  free(c);
}

static entry *find(pe_step_graphs *c, const pe_step_key *k) {
  for (int i = 0; i < c->n; i++)
    if (pe_step_key_equal(&c->e[i].key, k)) return &c->e[i];
  return NULL;
}

/* A free slot: the next one, or the least recently used entry's. */
static entry *slot(pe_step_graphs *c) {
  if (c->n < c->max) return &c->e[c->n++];
  entry *lru = &c->e[0];
  for (int i = 1; i < c->n; i++)
    if (c->e[i].last < lru->last) lru = &c->e[i];
  entry_clear(c, lru);
  c->st.evictions++;
  return lru;
}

pe_status *pe_step_graphs_lookup(pe_step_graphs *c, const pe_step_key *k, pe_step_action *action,
                                 void **graph, const char **reason) {
  *graph = NULL;
  *reason = NULL;
  entry *x = find(c, k);
  if (!x) {
    uint8_t *copy = malloc(k->len ? k->len : 1);
    if (!copy) return pe_error(PE_ENOMEM, "captured steps: out of memory for a key");
    memcpy(copy, k->bytes, k->len);
    x = slot(c);
    x->key = (pe_step_key){.bytes = copy, .len = k->len, .hash = k->hash};
  }
  x->last = ++c->clock;
  if (x->refused) {
    *action = PE_STEP_FALLBACK;
    *reason = x->refused;
    c->st.fallbacks++;
  } else if (x->graph) {
    *action = PE_STEP_REPLAY;
    *graph = x->graph;
    c->st.replays++;
  } else {
    *action = x->steps == 0 ? PE_STEP_WARMUP : PE_STEP_CAPTURE;
  }
  x->steps++;
  return NULL;
}

void pe_step_graphs_store(pe_step_graphs *c, const pe_step_key *k, void *graph) {
  entry *x = find(c, k);
  if (!x) { /* evicted meanwhile: the graph has no owner but the cache */
    if (graph && c->free_graph) c->free_graph(graph);
    return;
  }
  if (x->graph && c->free_graph) c->free_graph(x->graph);
  x->graph = graph;
  c->st.captures++;
}

void pe_step_graphs_refuse(pe_step_graphs *c, const pe_step_key *k, const char *why) {
  entry *x = find(c, k);
  char *copy = strdup(why ? why : "capture refused");
  char *last = strdup(why ? why : "capture refused");
  free(c->last_reason);
  c->last_reason = last;
  if (!x) {
    free(copy);
    return;
  }
  if (x->graph && c->free_graph) c->free_graph(x->graph);
  x->graph = NULL;
  free(x->refused);
  /* Out of memory for the text: still refuse, with a fixed reason. */
  x->refused = copy ? copy : strdup("capture refused");
}

void pe_step_graphs_invalidate(pe_step_graphs *c, pe_step_invalidation why) {
  (void)why; /* every kind drops every graph: each may have moved a buffer */
  for (int i = 0; i < c->n; i++) entry_clear(c, &c->e[i]);
  c->n = 0;
  free(c->last_reason);
  c->last_reason = NULL;
  c->st.invalidations++;
}

void pe_step_graphs_stats(const pe_step_graphs *c, pe_step_graph_stats *out) {
  *out = c->st;
  out->keys = c->n;
  out->last_reason = c->last_reason ? c->last_reason : "";
}
