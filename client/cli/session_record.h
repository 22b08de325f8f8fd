/* Which pe-client register made a program: its session (client id and
 * last request id), kept in a file of this user's, so that a later
 * `pe-client deregister --handle H` of the same user continues that
 * session and the daemon takes it for the program's owner (no --force).
 *
 * The files live in $XDG_RUNTIME_DIR/pe-client/, else /tmp/pe-client-UID/,
 * a directory of mode 0700 that this user owns (one that is not is not
 * used: no record is kept or read). A file is named by the handle and a
 * hash of the socket address, so the same program registered with two
 * daemons has two. A client id is the session's only credential: only
 * this user can read it. */
#ifndef PE_CLI_SESSION_RECORD_H
#define PE_CLI_SESSION_RECORD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cli_session {
  uint64_t client_id, last_request;
} cli_session;

/* Record that session s registered handle on address; false when it could
 * not be written (the caller warns: deregister then needs --force). */
bool cli_session_save(const char *address, uint64_t handle, cli_session s);
/* The recorded session of handle on address; false when there is none. */
bool cli_session_load(const char *address, uint64_t handle, cli_session *s);
/* Forget it (the program was deregistered). */
void cli_session_forget(const char *address, uint64_t handle);

#endif
