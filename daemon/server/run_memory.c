/* pe_run_memory_check (run_memory.h). */
#include "server/run_memory.h"

#include "engine/par_executor.h"
#include "server/server.h"

pe_status *pe_run_memory_check(pe_server *s, const pe_srv_program *p, int64_t rows) {
  int64_t limit = pe_server_limits(s).memory_per_run;
  const pe_graph *g = pe_par_exec_graph(p->exec);
  int64_t need = pe_graph_run_bytes(g, rows);
  if (limit <= 0 || need <= limit) return NULL;
  return pe_error(PE_ENOMEM,
                  "run: a batch of %lld rows needs %lld bytes of temporaries per step (%.1f MiB, "
                  "the memory plan of program 0x%016llx on %s:%d), over the limit [limits] "
                  "memory_per_run = %lld; send smaller batches",
                  (long long)rows, (long long)need, need / 1048576.0, (unsigned long long)p->handle,
                  pe_place_kind_name(g->place_kind), g->n_places, (long long)limit);
}
