/* Shared-memory regions readable by a daemon that runs as another user.
 *
 * The client creates its regions with mode 0600. Installed as a service the
 * daemon runs as its own user (pe-executord) while trainers run as theirs,
 * and it maps a region by name, so it needs read access: a POSIX ACL entry
 * for the daemon's uid (the owner of the socket file the client connected
 * to), read only. Group and others stay without access: other trainers in
 * the daemon's group cannot read each other's batches. */
#include <acl/libacl.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/acl.h>
#include <unistd.h>

#include "client_internal.h"

int pec_shm_grant_daemon(pe_client *c, int fd, const char *name) {
  static const char what[] = "register_shm";
  /* root reads any region: no entry needed (nor ACL support) for it. */
  if (!c->daemon_uid_known || c->daemon_uid == geteuid() || c->daemon_uid == 0) return 0;
  /* The mask bounds the named entry: r--. */
  char text[128];
  snprintf(text, sizeof text, "u::rw-,u:%u:r--,g::---,m::r--,o::---", (unsigned)c->daemon_uid);
  acl_t acl = acl_from_text(text);
  if (!acl) return pec_fail(c, PE_C_EIO, "%s: %s: ACL '%s': %s", what, name, text, strerror(errno));
  int rc = acl_set_fd(fd, acl);
  int e = errno;
  acl_free(acl);
  if (rc != 0)
    return pec_fail(c, PE_C_EIO,
                    "%s: %s: giving the daemon's user (uid %u, the owner of %s) read access: "
                    "acl_set_fd: %s (shared memory with a daemon of another user needs POSIX "
                    "ACLs on /dev/shm; send feeds through the socket instead)",
                    what, name, (unsigned)c->daemon_uid, c->address + 6, strerror(e));
  return 0;
}
