/* Save and Load of a model's persistables as a named checkpoint under the
 * state directory (format and atomic write: checkpoint/file.h).
 *
 * Save reads every persistable (place 0's value) in one engine op
 * (pe_model_get_many), after the runs pushed before it and before those
 * pushed after it, so a checkpoint is one step boundary even while other
 * clients train the model. Load checks the whole file (magic, CRC, bounds)
 * before setting anything, then sets every tensor on every place in one
 * engine op (dtype and shape must match the model's claims, registry/model_shapes.h:
 * a parameter's value or a bound program's declaration; names the model
 * does not know are created, but a file none of whose tensors it knows is
 * refused, PE_EUNKNOWN_VAR: of another architecture). A save's write is
 * refused once the model has been dropped (registry/model_drop.h).
 *
 * Threads: any non-pool thread; the model must be acquired. */
#ifndef PE_SERVER_CHECKPOINT_H
#define PE_SERVER_CHECKPOINT_H

#include <stdint.h>

#include "server/registry/registry.h"

/* path: malloc'd absolute path of the file; bytes: its size. A client's
 * Save: the model's restart checkpoint name (m->restart_name, config
 * shutdown_checkpoint) is refused (PE_EINVAL), since the daemon overwrites
 * that file and drop-model removes it; Load of it is allowed. Every write
 * (these two, autosave, shutdown) is refused (PE_EINVAL, the file left as
 * it is) for a model with no values, or with a NaN/Inf value, naming the
 * first such variable. A Load of a file with no tensors
 * is refused (PE_EINVAL). */
pe_status *pe_checkpoint_save(const char *state_dir, pe_srv_model *m, const char *name, char **path,
                              uint64_t *bytes);
/* The restart checkpoint (autosave, shutdown): written as m->restart_name. */
pe_status *pe_checkpoint_save_restart(const char *state_dir, pe_srv_model *m, char **path,
                                      uint64_t *bytes);
pe_status *pe_checkpoint_load(const char *state_dir, pe_srv_model *m, const char *name, char **path,
                              uint64_t *bytes);
/* A model with nothing initialised yet starts from its restart checkpoint
 * `name` when one exists (daemon restart), at the register of a program
 * (decl: its persistables), persistent or not: a model name's restart
 * checkpoint is never replaced by values that did not come from it (a
 * model restored by non-persistent programs only is not persistent and
 * never writes the file; a persistent program joining it keeps the
 * values). A register is refused, with the file kept byte for byte and
 * nothing of it set (the model gets no values), when the file
 *   - does not fit the program or the model's claims (registry/model_shapes.h):
 *     PE_ESHAPE, PE_EDTYPE naming the variable and both shapes;
 *   - cannot be read: corrupt (CRC, truncated: PE_ECORRUPT), of a format
 *     version this daemon does not read (PE_ECORRUPT), not a readable file
 *     (PE_EIO): the reader's reason;
 *   - meets a model that has values already (a SetParams or Load before
 *     the first register's restore): PE_EINVAL, the way out being a Load
 *     of the file or drop-model.
 * Each error names the model, the file and the way out (another model
 * name, or pe-client drop-model, which removes the file). Once a register
 * passes (or a Load reads the file: pe_checkpoint_load), a model with
 * values does not look at the file again (restart_seen). Holds the
 * model's init_mu. */
pe_status *pe_checkpoint_restore(const char *state_dir, const char *name, pe_srv_model *m,
                                 const pe_var_info *decl, int n_decl);
/* <state_dir>/models/<model>/<name>.ckpt (names validated). */
pe_status *pe_checkpoint_path(const char *state_dir, const char *model, const char *name, char *dir,
                              size_t dir_len, char *file, size_t file_len);

#endif
