/* Shared-memory region names that say who made them, so that a region a
 * killed trainer left in /dev/shm can be told apart from a live one:
 *
 *   /pe-<pid>-<start>-<random>
 *
 * pid: the creating process; start: its start time (field 22 of
 * /proc/<pid>/stat, clock ticks since boot, hex), which tells a reused pid
 * apart; random: 16 hex digits. A creator is gone when no process has its
 * pid, or the one that has it started at another time. Names are listed in
 * /dev/shm for everyone: they hold nothing of the client (its id is a
 * credential; older names "/pe-<pid>-<start>-<client id>-<n>" did, and are
 * still parsed so that the sweeps remove them).
 *
 * Only meaningful within one pid namespace (the creator's): a sweeper that
 * sees other pids takes a live creator for gone. Its mapping and the
 * daemon's stay valid then; only the name goes.
 *
 * Compiled into libpeclient (names, the sweep) and the daemon (regions of
 * an expired session). No state; thread-safe. */
#ifndef PE_COMMON_SHM_OWNER_H
#define PE_COMMON_SHM_OWNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A fresh name for a region of this process ('/' first); -1 when it does
 * not fit len. */
int pe_shm_owner_name(char *buf, size_t len);
/* The creator of a region named so (with or without the leading '/'), or
 * by the older "/pe-<pid>-<start>-<client id>-<n>"; false for any other
 * name (the oldest "/pe-<client id>-<n>" included). */
bool pe_shm_owner_parse(const char *name, long *pid, uint64_t *start);
/* This process's pid and start time (start 0 when /proc does not say);
 * libpeclient sends them with its requests (Request.client_pid). */
void pe_shm_owner_self(long *pid, uint64_t *start);
/* The creator (pid, start) has exited. Not gone when in doubt (/proc
 * unreadable for a reason other than the process's absence). */
bool pe_shm_owner_gone(long pid, uint64_t start);

#endif
