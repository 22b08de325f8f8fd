/* The daemon's socket (server/loop.h): a nanomsg raw REP socket bound to
 * [server] socket; an ipc file gets socket_mode and socket_group. */
#include <errno.h>
#include <grp.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/loop.h"

pe_status *open_socket(pe_server *s) {
  pe_loop *L = s->loop;
  const char *addr = s->cfg.socket;
  L->sock = nn_socket(AF_SP_RAW, NN_REP);
  if (L->sock < 0) return pe_error(PE_EIO, "socket: nn_socket: %s", nn_strerror(nn_errno()));
  int maxsz = (int)s->cfg.max_message;
  if (nn_setsockopt(L->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsz, sizeof maxsz) < 0)
    return pe_error(PE_EIO, "socket: NN_RCVMAXSIZE %d: %s", maxsz, nn_strerror(nn_errno()));
  if (!strncmp(addr, "ipc://", 6)) {
    snprintf(L->ipc_path, sizeof L->ipc_path, "%s", addr + 6);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", L->ipc_path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
      *slash = 0;
      PE_TRY(pe_status_wrap(pe_mkdir_p(dir, 0755), "socket %s", addr));
    }
  }
  /* An ipc socket file is created with 0777 & ~umask: under a permissive
   * umask it would be open to everyone until the chmod below, and a
   * connection made meanwhile stays. So it is created with socket_mode's
   * owner bits only, then given socket_group, and only then its group and
   * other bits (chmod below). The umask is process-wide: this runs during start-up, before
   * the request and autosave threads exist, and the pool's and devices'
   * threads create no files. */
  mode_t umask_was = 0;
  if (L->ipc_path[0]) umask_was = umask(~(mode_t)(s->cfg.socket_mode & 0700) & 0777);
  int bound = nn_bind(L->sock, addr);
  int bind_err = bound < 0 ? nn_errno() : 0;
  if (L->ipc_path[0]) {
    /* nanomsg 1.1.5 binds on this thread; wait (1 s) in case a version
     * creates the file on its worker thread, still under the umask. */
    struct stat sb;
    for (int i = 0; bound >= 0 && i < 100 && stat(L->ipc_path, &sb) != 0; i++) usleep(10000);
    umask(umask_was);
  }
  if (bound < 0) return pe_error(PE_EIO, "socket: bind %s: %s", addr, nn_strerror(bind_err));
  if (L->ipc_path[0]) {
    if (s->cfg.socket_group && s->cfg.socket_group[0]) {
      struct group *g = getgrnam(s->cfg.socket_group);
      if (!g)
        return pe_error(PE_ENOTFOUND, "socket %s: group '%s' not found", addr, s->cfg.socket_group);
      if (chown(L->ipc_path, (uid_t)-1, g->gr_gid) != 0)
        return pe_error(PE_EIO, "socket %s: chgrp %s: %s", addr, s->cfg.socket_group,
                        strerror(errno));
    }
    if (chmod(L->ipc_path, s->cfg.socket_mode) != 0)
      return pe_error(PE_EIO, "socket %s: chmod %o: %s", addr, s->cfg.socket_mode, strerror(errno));
  }
  return NULL;
}
