/* places = auto's choices, remembered in the state dir: <state>/places/
 * <key>.choice per program and machine, so that the next register of the
 * program (another model name, a restarted daemon) skips the trial.
 *
 * The key hashes the program's bytes, its options that shape the compile
 * (not its places, seed or persistence), the batch timed and the machine
 * (CPU model, online cores, ISA). The file is text, written atomically
 * (format/durable_file.h); one that does not parse, or names another
 * machine, is ignored with a warning and replaced by the next trial.
 *
 * A model's choice is kept beside its restart checkpoint as well
 * (<state>/models/<model>/places.choice): a model restored after a restart
 * comes back on the places and strategy it trained on, whichever of its
 * programs registers first (an evaluation program runs no trial, and
 * another program's remembered choice may differ). drop-model removes it
 * with the checkpoint. */
#ifndef PE_SERVER_PLACES_RECALL_H
#define PE_SERVER_PLACES_RECALL_H

#include "server/places_trial.h"

/* This machine: "<cpu model>|<cores> cores|<isa>". */
void pe_places_machine(char *buf, size_t cap);
/* The file name of rq's choice at `batch` on machine (buf: >= 32 bytes). */
pe_status *pe_places_key(const Pe__RegisterRequest *rq, int64_t batch, const char *machine,
                         char *buf, size_t cap);
/* Read dir/places/<file> into *t (its candidates, choice and batch;
 * t->remembered set): true when it holds a valid choice for machine and
 * batch. A missing file is false quietly; an unreadable or corrupt one is
 * false with a warning naming the file and what is wrong. */
bool pe_places_recall(const char *state_dir, const char *file, const char *machine, int64_t batch,
                      pe_places_trial *t);
/* Write t as dir/places/<file> (atomically). */
pe_status *pe_places_remember(const char *state_dir, const char *file, const char *machine,
                              const pe_places_trial *t);

#define PE_PLACES_MODEL_FILE "places.choice"
/* The choice model (a valid model name) was created on, written by
 * pe_places_remember_model, for machine, of any batch; as pe_places_recall. */
bool pe_places_recall_model(const char *state_dir, const char *model, const char *machine,
                            pe_places_trial *t);
pe_status *pe_places_remember_model(const char *state_dir, const char *model, const char *machine,
                                    const pe_places_trial *t);

#endif
