/* One daemon per state directory.
 *
 * Two daemons on one state dir checkpoint the same model names into the
 * same files, and the later shutdown checkpoint overwrites the other's.
 * At start the daemon therefore takes flock(LOCK_EX | LOCK_NB) on
 * <state_dir>/pe-executord.lock and keeps it for its lifetime; a second
 * daemon is refused with the directory and the holder's pid (written into
 * the file). flock rather than an O_EXCL file: the kernel drops the lock
 * when its holder dies, so a crashed daemon's file does not block a restart.
 *
 * The descriptor is O_CLOEXEC (a child exec'd by the daemon does not keep
 * the lock). Main thread only. */
#ifndef PE_SERVER_STATE_LOCK_H
#define PE_SERVER_STATE_LOCK_H

#include "core/status.h"

#define PE_STATE_LOCK_FILE "pe-executord.lock"

/* Lock state_dir (which exists); *fd: the lock, for pe_state_unlock. */
pe_status *pe_state_lock(const char *state_dir, int *fd);
/* Release (fd < 0: no-op). */
void pe_state_unlock(int fd);

#endif
