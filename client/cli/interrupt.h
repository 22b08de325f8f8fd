/* Ctrl-C and kill of a command that holds a session (train, eval): the
 * process ends its session before it dies, so that the daemon frees its
 * programs and model at once rather than after the session TTL (what a
 * tcp:// client would otherwise leave behind; on ipc:// the daemon also
 * notices the process exit).
 *
 * SIGINT, SIGTERM, SIGHUP and SIGQUIT (where their action is the default:
 * an ignored one, nohup, stays ignored) run a handler that unlinks the
 * process's shared-memory regions (pe_client_shm_unlink_all) and wakes a
 * watcher thread through a pipe; nothing else happens in the handler. The
 * watcher ends the watched handle's session (pe_client_interrupt: the
 * request in flight gets up to 1 s, the close up to 1 s) and then the
 * process dies of the signal, as before (the shell's 130, 143, ...). A
 * second signal meanwhile kills it at once. */
#ifndef PE_CLI_INTERRUPT_H
#define PE_CLI_INTERRUPT_H

#include "cli.h"

/* Install the handlers and start the watcher (once per process; failures
 * leave the handlers out: a signal then kills as by default). */
void cli_interrupt_install(const cli_ctx *ctx);
/* The handle whose session a signal ends (NULL: none). Clearing it waits
 * while the watcher is ending the session (the process then dies). */
void cli_interrupt_watch(pe_client *c);
/* A signal came: the process is ending (the command's own errors from
 * here on are its consequences, not printed). */
bool cli_interrupted(void);

#endif
