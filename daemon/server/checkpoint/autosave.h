/* Autosave: a thread that checkpoints the persistent models periodically,
 * so that a daemon killed without SIGTERM (SIGKILL, the OOM killer, a crash)
 * restarts from the last autosave instead of the last explicit Save.
 *
 * Every interval it writes each persistent model that changed since its
 * last autosave (pe_model_changes) under the restart checkpoint's name
 * (config shutdown_checkpoint), the file pe_checkpoint_restore reads at
 * the next start. Skipped: models that did not change, and models with no
 * initialised parameter yet (their restart checkpoint may be about to be
 * loaded). A failed save is logged and retried at the next interval.
 *
 * Threads: its own plain pthread (saves block for seconds and
 * pe_checkpoint_save must not run on a pool worker). The bookkeeping (last
 * saved change count per model name) belongs to that thread alone;
 * pe_autosave_set_interval and pe_autosave_stop may be called from any
 * other thread and wake it at once. */
#ifndef PE_SERVER_AUTOSAVE_H
#define PE_SERVER_AUTOSAVE_H

#include "core/status.h"

typedef struct pe_registry pe_registry;
typedef struct pe_autosave pe_autosave;

/* Start the thread. The registry must outlive pe_autosave_stop; state_dir
 * and name are copied. interval_s <= 0: idle until an interval is set. */
pe_status *pe_autosave_start(pe_registry *reg, const char *state_dir, const char *name,
                             double interval_s, pe_autosave **out);
/* A new interval (SIGHUP). The next pass is due one new interval after the
 * last one ended (at once when that is past); turning autosave on from 0
 * counts from now. */
void pe_autosave_set_interval(pe_autosave *a, double interval_s);
/* Wake the thread, let it finish the model it is saving (it starts no
 * other), join it and free everything. NULL is a no-op. */
void pe_autosave_stop(pe_autosave *a);

#endif
