/* Tensors between the wire (Pe__Tensor: inline bytes or a shm reference)
 * and the engine (pe_tensor), shared by the handlers that take values in
 * (run feeds, SetParams) and give them back (run fetches, GetParams).
 * Checks name the op, the tensor, its dtype and shape. Threads: any (the
 * shm table has its own lock). */
#ifndef PE_SERVER_WIRE_TENSOR_H
#define PE_SERVER_WIRE_TENSOR_H

#include "core/arena.h"
#include "server/dispatch.h"
#include "server/shm.h"

/* A zeroed host tensor owned by the arena (its buffer released with it);
 * NULL on out of memory. */
pe_tensor *pe_arena_tensor(pe_arena *a);

/* Check a wire tensor and make `view` hold its bytes: a view of the message
 * for inline data, an owned copy for a shm reference (release it after use;
 * arena tensors are released with the arena). With `pin`, a shm reference
 * is pinned there instead of copied and `view` gets the dtype and shape
 * only (data NULL): the caller reads the rows through the pin. A shm
 * reference must name a region of `client`, the requesting client
 * (shm.h). A reference with row indices (ShmRef.rows) is checked whole
 * (one index per row of dim 0, each inside the array) and gathered, or
 * with `pin` its whole array pinned (pe_shm_pin_read_rows reads it). */
pe_status *pe_wire_tensor_in(pe_server *s, uint64_t client, const char *op, const Pe__Tensor *x,
                             pe_tensor *view, pe_shm_pin *pin);

/* The name of tensor i of a list of wire tensors (Pe__Tensor *const *),
 * for pe_names_unique. */
const char *pe_wire_tensor_name_at(const void *list, size_t i);

/* A host tensor into a wire tensor that borrows its bytes (t must outlive
 * packing: it is arena-owned). NULL on out of memory. */
Pe__Tensor *pe_wire_tensor_out(pe_arena *a, const char *name, const pe_tensor *t);

#endif
