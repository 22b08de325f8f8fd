/* Connections that end before they deliver a request: how a message over
 * [limits] max_message shows. nanomsg drops such a message inside its
 * transport (NN_RCVMAXSIZE): it reads the size from the message's header
 * and closes the connection, telling the daemon nothing; its statistics
 * count that as a broken connection, exactly like a client that
 * disconnects normally. What a dropped message leaves apart is a
 * connection that ended without delivering one (a nanomsg REQ client
 * then reconnects and resends it, each time on a new connection that ends
 * the same way).
 *
 * The watch counts those: raw REP's routing header starts with the id of
 * the connection (pipe) the message came on, so the ids seen tell the
 * connections that delivered something (D); nanomsg's statistics give
 * the connections accepted (A) and open now (C). A - C - D is a lower
 * bound of the connections that ended without delivering anything
 * (exact when every open one has delivered something), so it never
 * reports one that did not happen; the poll reports its growth. A client
 * that connects and leaves without sending counts too, which the warning
 * says; which peer it was, nanomsg does not tell.
 *
 * The ids seen are a set of at most PE_CONN_WATCH_IDS; when it fills up it
 * starts again, and a connection open across that may count twice in D,
 * which can only hide later drops, never invent one.
 *
 * Threads: the main thread only (the socket loop). */
#ifndef PE_SERVER_CONN_WATCH_H
#define PE_SERVER_CONN_WATCH_H

#include <nanomsg/nn.h>
#include <stdint.h>

#define PE_CONN_WATCH_IDS 65536

typedef struct pe_conn_watch pe_conn_watch;

pe_conn_watch *pe_conn_watch_new(void); /* NULL: out of memory */
void pe_conn_watch_free(pe_conn_watch *w);
/* A message arrived with the control data of hdr (nn_recvmsg with
 * msg_controllen NN_MSG on a raw REP socket). */
void pe_conn_watch_message(pe_conn_watch *w, const struct nn_msghdr *hdr);
/* Connections of socket sock newly known to have ended without
 * delivering a message, since the last poll. */
uint64_t pe_conn_watch_poll(pe_conn_watch *w, int sock);

#endif
