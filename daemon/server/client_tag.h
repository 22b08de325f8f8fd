/* What the daemon's log says for a client at info and warn level.
 *
 * A client id is a bearer credential: whoever sends requests with it acts
 * as that client (closes its session, deregisters its programs, feeds from
 * its regions). The log may be read by others (the journal), so info and
 * warn lines name a client by a tag: 8 hex digits of a keyed hash of the
 * id, the key drawn at random once per daemon run. The same client has the
 * same tag for the whole run; the tag does not give the id back (32 bits of
 * a 64-bit id), and without the key it cannot be checked against a guessed
 * id. Debug lines may print the id itself.
 *
 * Thread-safe (the key is drawn once, pthread_once). */
#ifndef PE_SERVER_CLIENT_TAG_H
#define PE_SERVER_CLIENT_TAG_H

#include <stdint.h>

/* "c-" and 8 hex digits, NUL included. */
#define PE_CLIENT_TAG_LEN 11
typedef struct pe_client_tag_buf {
  char s[PE_CLIENT_TAG_LEN];
} pe_client_tag_buf;

/* The tag of client id, by value: usable as an argument of a log call,
 * e.g. PE_LOGI("... client %s", pe_client_tag(id).s). */
pe_client_tag_buf pe_client_tag(uint64_t client);

#endif
