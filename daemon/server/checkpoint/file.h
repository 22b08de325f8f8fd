/* Checkpoint files: their names and their place under the state directory.
 * No model here (checkpoint/save_load.c glues this to pe_model), so this part
 * is testable without an executor.
 *
 * Layout under the state directory:
 *     <state_dir>/models/<model>/<name>.ckpt
 * Model and checkpoint names: [A-Za-z0-9._-]{1,64}, not starting with '.'
 * (no "..", no '/', no hidden files). The format is
 * format/checkpoint_format.h, the writes format/durable_file.h (pe-client's
 * export and import use them too). */
#ifndef PE_SERVER_CHECKPOINT_FILE_H
#define PE_SERVER_CHECKPOINT_FILE_H

#include <stdbool.h>

#include "core/status.h"
#include "format/checkpoint_format.h"
#include "format/durable_file.h"

#define PE_NAME_MAX 64

/* [A-Za-z0-9._-]{1,64}, not starting with '.'. */
bool pe_name_valid(const char *name);
/* NULL, or PE_EINVAL naming `what` ("checkpoint name", "model name") and why. */
pe_status *pe_name_check(const char *what, const char *name);

#endif
