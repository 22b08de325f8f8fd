/* Temporaries of interrupted checkpoint writes: a kill -9,
 * an OOM kill or a power loss during pe_write_atomic leaves
 * <state_dir>/models/<model>/<name>.ckpt.tmp.<pid>.<n>, as large as the
 * checkpoint, which nothing else removes. A daemon that holds the state
 * dir's lock (state_lock.h) is its only writer, so at its start every such
 * file is stale: removed here, each one logged (warn), with its size.
 * Files of any other name are left alone. */
#ifndef PE_SERVER_CHECKPOINT_STALE_H
#define PE_SERVER_CHECKPOINT_STALE_H

/* Call with the state dir's lock held, before any checkpoint write.
 * Returns the number of files removed; a file or directory that cannot be
 * read or removed is logged and skipped (never fatal). */
int pe_ckpt_remove_stale(const char *state_dir);

#endif
