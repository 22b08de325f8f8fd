/* The connection: socket options, ids, and the one request/reply exchange
 * every call goes through (pec_call). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "shm_owner.h"

#define DEFAULT_TIMEOUT_MS 60000
#define DEFAULT_SEND_TIMEOUT_MS 5000
#define DEFAULT_RESTART_WAIT_MS 10000
/* Resends and nanomsg 1.1.5. The REQ socket accepts only the reply to the
 * last copy it sent; a reply to an older copy is dropped by nn_req_in with
 * nn_msg_term but not re-initialised, so (a) arriving after the newest
 * copy's reply it frees that stored reply (nn_recv then aborts on the chunk
 * tag), and (b) arriving last it is freed again by nn_close (nn_req_term).
 * The daemon answers the copies of a request in the order they arrived and
 * never an older copy after a newer one (daemon/server/reply_cache.h), which
 * rules out (a) for this daemon. Against (b) and nanomsg's own timer resend: the timer resend
 * is switched off (a ~12-day interval); by default a request is sent once,
 * and nanomsg resends it only when the connection to the daemon is
 * re-established (it replays the same copy). With resend_ivl_ms set, the
 * client re-sends the same bytes (same ids, so the daemon applies it once)
 * after each interval without a reply, and such a handle is never
 * nn_close'd (pe_client_free): its socket stays open until the process
 * exits, instead of risking (b). */
#define NN_TIMER_RESEND_OFF_MS (1 << 30)
#define UNIX_PATH_MAX 108 /* sizeof sockaddr_un.sun_path */

const char *pe_client_strategy_name(pe_client_strategy s) {
  static const char *const names[] = {"auto", "allreduce", "reduce", "sharded"};
  return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

const char *pe_client_code_name(int code) {
  static const char *const names[] = {
      [PE_C_OK] = "OK",
      [PE_C_EINVAL] = "INVALID_ARGUMENT",
      [PE_C_ENOMEM] = "OUT_OF_MEMORY",
      [PE_C_ENOTFOUND] = "NOT_FOUND",
      [PE_C_EUNKNOWN_OP] = "UNKNOWN_OP",
      [PE_C_EUNKNOWN_VAR] = "UNKNOWN_VARIABLE",
      [PE_C_EATTR] = "BAD_ATTRIBUTE",
      [PE_C_EARITY] = "BAD_ARITY",
      [PE_C_ESHAPE] = "SHAPE_MISMATCH",
      [PE_C_EDTYPE] = "DTYPE_MISMATCH",
      [PE_C_EUSE_BEFORE_DEF] = "USE_BEFORE_DEFINITION",
      [PE_C_ECYCLE] = "CYCLE",
      [PE_C_EMISSING_FEED] = "MISSING_FEED",
      [PE_C_EIO] = "IO_ERROR",
      [PE_C_ECORRUPT] = "CORRUPT_DATA",
      [PE_C_ENOGRAD] = "NO_GRADIENT",
      [PE_C_EBACKEND] = "BACKEND_ERROR",
      [PE_C_EINTERNAL] = "INTERNAL",
      [PE_C_EALREADY] = "ALREADY_APPLIED",
      [PE_C_EPERM] = "PERMISSION_DENIED",
      [PE_C_EEXHAUSTED] = "RESOURCE_EXHAUSTED",
      [PE_C_EDEADLINE] = "DEADLINE_EXCEEDED",
      [PE_C_ESHUTDOWN] = "SHUTTING_DOWN",
      [PE_C_ETIMEDOUT] = "TIMED_OUT",
      [PE_C_ECONNECT] = "CONNECTION_ERROR",
      [PE_C_ETOOBIG] = "MESSAGE_TOO_LARGE",
      [PE_C_EPROTO] = "PROTOCOL_ERROR",
      [PE_C_EARG] = "BAD_CLIENT_ARGUMENT",
      [PE_C_EROLLEDBACK] = "ROLLED_BACK",
  };
  if (code < 0 || (size_t)code >= sizeof names / sizeof names[0] || !names[code])
    return "UNKNOWN_CODE";
  return names[code];
}

int pec_fail(pe_client *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return code;
}

char *pe_client_default_address(char *buf, size_t len) {
  if (!buf || !len) return buf;
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (geteuid() == 0)
    snprintf(buf, len, "ipc:///run/pe-executord/pe-executord.sock");
  else if (xdg && *xdg)
    snprintf(buf, len, "ipc://%s/pe-executord.sock", xdg);
  else
    snprintf(buf, len, "ipc:///tmp/pe-executord-%u.sock", (unsigned)geteuid());
  return buf;
}

/* A positive integer from the environment, else dflt. */
static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  return (errno || *end || x <= 0) ? dflt : x;
}

static uint64_t random_id(void) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
    /* No entropy source: time and pid still make clashes unlikely. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16);
  }
  return id ? id : 1; /* 0 reads as "unset" in proto3 */
}

pe_client *pe_client_new(void) {
  pe_client *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->sock = -1;
  c->client_id = random_id();
  return c;
}

static void drop_results(pe_client *c) {
  if (c->reply) pe__reply__free_unpacked(c->reply, NULL);
  c->reply = NULL;
  free(c->results);
  c->results = NULL;
  free(c->trace);
  c->trace = NULL;
}

void pe_client_free(pe_client *c) {
  if (!c) return;
  drop_results(c);
  pec_recover_free(c);
  /* A socket that resent may hold a freed-but-not-reset message (see the
   * note on resends above): closing it would abort the process. */
  if (c->sock >= 0 && !c->resent) nn_close(c->sock);
  free(c);
}

const char *pe_client_error(const pe_client *c) {
  return c ? c->err : "no client handle";
}
const char *pe_client_address(const pe_client *c) {
  return c ? c->address : "";
}
uint64_t pe_client_id(const pe_client *c) {
  return c ? c->client_id : 0;
}
uint64_t pe_client_last_request_id(const pe_client *c) {
  return c ? c->last_request_id : 0;
}
size_t pe_client_max_message(const pe_client *c) {
  return c ? c->max_message : 0;
}

void *pec_results_alloc(pe_client *c, size_t bytes) {
  free(c->results);
  c->results = calloc(1, bytes ? bytes : 1);
  return c->results;
}

static int set_int_opt(pe_client *c, int level, int opt, int value, const char *name) {
  if (nn_setsockopt(c->sock, level, opt, &value, sizeof value) == 0) return 0;
  return pec_fail(c, PE_C_ECONNECT, "connect %s: setting %s = %d: %s", c->address, name, value,
                  nn_strerror(nn_errno()));
}

int pe_client_set_timeout(pe_client *c, int timeout_ms) {
  PEC_NEED_HANDLE(c);
  if (timeout_ms <= 0) return pec_fail(c, PE_C_EARG, "set_timeout: %d ms is not > 0", timeout_ms);
  c->timeout_ms = timeout_ms; /* NN_RCVTIMEO is set per wait (pec_call) */
  return 0;
}

/* A plain unix-socket connect to path (shorter than UNIX_PATH_MAX),
 * closed at once: 0 when it connected (or no socket could be made), else
 * its errno. The daemon's nanomsg sees a peer that went away before its
 * handshake. */
static int connect_errno(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int r = connect(fd, (struct sockaddr *)&sa, sizeof sa), e = errno;
  close(fd);
  return r == 0 ? 0 : e;
}

/* What nanomsg would only show as a timeout (it connects in the
 * background and retries) is said now: no permission on the socket, or
 * nobody listening (a stale file of a daemon that exited). Anything else
 * (a full backlog: EAGAIN) is left to nanomsg. */
static int probe_ipc_path(pe_client *c, const char *path, const struct stat *st) {
  int e = connect_errno(path);
  if (e == 0) return 0;
  if (e == EACCES || e == EPERM) {
    const struct group *g = getgrgid(st->st_gid);
    char gname[64];
    if (g)
      snprintf(gname, sizeof gname, "%s", g->gr_name);
    else
      snprintf(gname, sizeof gname, "%u", (unsigned)st->st_gid);
    return pec_fail(c, PE_C_ECONNECT,
                    "connect %s: permission denied on %s (mode %04o, group %s: the daemon's "
                    "socket_mode and socket_group): join group %s or ask the daemon's admin",
                    c->address, path, (unsigned)(st->st_mode & 07777), gname, gname);
  }
  if (e == ECONNREFUSED)
    return pec_fail(c, PE_C_ECONNECT,
                    "connect %s: no daemon is listening on %s (a stale socket of a daemon that "
                    "exited?); is pe-executord running?",
                    c->address, path);
  return 0;
}

/* For ipc:// addresses: a missing socket file means no daemon, said now
 * rather than as a timeout later (nanomsg connects in the background); so
 * do a socket without access and one nobody listens on (probe_ipc_path). */
static int check_ipc_path(pe_client *c) {
  if (strncmp(c->address, "ipc://", 6) != 0) return 0;
  const char *path = c->address + 6;
  if (strlen(path) >= UNIX_PATH_MAX)
    return pec_fail(c, PE_C_ECONNECT,
                    "connect %s: socket path is %zu bytes, over the %d-byte limit of a unix "
                    "socket path",
                    c->address, strlen(path), UNIX_PATH_MAX - 1);
  struct stat st;
  if (stat(path, &st) != 0)
    return pec_fail(c, PE_C_ECONNECT,
                    "connect %s: no daemon socket at %s (%s); is pe-executord running? (set "
                    "--socket or PE_SOCKET)",
                    c->address, path, strerror(errno));
  if (!S_ISSOCK(st.st_mode))
    return pec_fail(c, PE_C_ECONNECT, "connect %s: %s exists but is not a socket", c->address,
                    path);
  c->daemon_uid = st.st_uid; /* bind() made the file: the daemon's user */
  c->daemon_uid_known = true;
  return probe_ipc_path(c, path, &st);
}

int pe_client_connect(pe_client *c, const pe_client_opts *opts) {
  PEC_NEED_HANDLE(c);
  pe_client_opts o = opts ? *opts : (pe_client_opts){0};
  c->err[0] = 0;
  if (c->sock >= 0)
    return pec_fail(c, PE_C_EARG, "connect: handle already connected to %s", c->address);
  const char *addr = o.address && *o.address ? o.address : getenv("PE_SOCKET");
  if (addr && *addr)
    snprintf(c->address, sizeof c->address, "%s", addr);
  else
    pe_client_default_address(c->address, sizeof c->address);
  c->timeout_ms =
      o.timeout_ms > 0 ? o.timeout_ms : (int)env_long("PE_TIMEOUT_MS", DEFAULT_TIMEOUT_MS);
  c->send_timeout_ms = o.send_timeout_ms > 0 ? o.send_timeout_ms : DEFAULT_SEND_TIMEOUT_MS;
  c->resend_ivl_ms = o.resend_ivl_ms > 0 ? o.resend_ivl_ms : 0; /* 0: never */
  c->restart_wait_ms = o.restart_wait_ms
                           ? o.restart_wait_ms
                           : (int)env_long("PE_RESTART_WAIT_MS", DEFAULT_RESTART_WAIT_MS);
  if (o.session_client_id) {
    c->client_id = o.session_client_id;
    c->last_request_id = o.session_last_request;
  }
  c->no_recover = o.no_recover;
  c->fail_on_rollback = o.fail_on_rollback;
  c->outlive_process = o.outlive_process;
  c->max_message = c->own_max_message =
      o.max_message ? o.max_message
                    : (size_t)env_long("PE_MAX_MESSAGE", PE_CLIENT_MAX_MESSAGE_DEFAULT);
  c->daemon_max_message = 0; /* the first reply says */
  if (c->max_message > (size_t)INT32_MAX)
    return pec_fail(c, PE_C_EARG, "connect: max_message %zu over the %d bytes nanomsg allows",
                    c->max_message, INT32_MAX);
  c->daemon_uid_known = false;
  int rc = check_ipc_path(c);
  if (rc) return rc;
  c->sock = nn_socket(AF_SP, NN_REQ);
  if (c->sock < 0)
    return pec_fail(c, PE_C_ECONNECT, "connect %s: nn_socket: %s", c->address,
                    nn_strerror(nn_errno()));
  if ((rc = set_int_opt(c, NN_SOL_SOCKET, NN_RCVMAXSIZE, (int)c->max_message, "NN_RCVMAXSIZE")) ||
      (rc = set_int_opt(c, NN_SOL_SOCKET, NN_RCVTIMEO, c->timeout_ms, "NN_RCVTIMEO")) ||
      (rc = set_int_opt(c, NN_SOL_SOCKET, NN_SNDTIMEO, c->send_timeout_ms, "NN_SNDTIMEO")) ||
      (rc = set_int_opt(c, NN_REQ, NN_REQ_RESEND_IVL, NN_TIMER_RESEND_OFF_MS, "NN_REQ_RESEND_IVL")))
    goto fail;
  if (nn_connect(c->sock, c->address) < 0) {
    int e = nn_errno();
    bool scheme = strncmp(c->address, "ipc://", 6) == 0 || strncmp(c->address, "tcp://", 6) == 0;
    /* An address nanomsg cannot parse (no or an unknown transport, a bad
     * host:port) is the caller's argument, not a daemon that is away. */
    bool bad_address = e == EINVAL || e == EPROTONOSUPPORT;
    rc = pec_fail(c, bad_address ? PE_C_EARG : PE_C_ECONNECT, "connect %s: %s%s", c->address,
                  nn_strerror(e), scheme ? "" : " (expected ipc://PATH or tcp://HOST:PORT)");
    goto fail;
  }
  return 0;
fail:
  nn_close(c->sock);
  c->sock = -1;
  return rc;
}

static const char *body_name(Pe__Reply__BodyCase b) {
  switch (b) {
    case PE__REPLY__BODY__NOT_SET: return "none";
    case PE__REPLY__BODY_REGISTER: return "register";
    case PE__REPLY__BODY_INIT: return "init";
    case PE__REPLY__BODY_RUN: return "run";
    case PE__REPLY__BODY_PARAMS: return "params";
    case PE__REPLY__BODY_CHECKPOINT: return "checkpoint";
    case PE__REPLY__BODY_STATUS: return "status";
    case PE__REPLY__BODY_SHM: return "shm";
    default: return "unknown";
  }
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Send the packed request (copied by nanomsg; the REQ socket drops any
 * earlier request still in flight, so a later reply to it is ignored). */
static int send_packed(pe_client *c, const char *what, const Pe__Request *req, const void *buf,
                       size_t size) {
  if (nn_send(c->sock, buf, size, 0) >= 0) return 0;
  int e = nn_errno();
  if (e == ETIMEDOUT || e == EAGAIN)
    return pec_fail(c, PE_C_ETIMEDOUT, "%s (request %llu): send to %s timed out after %d ms", what,
                    (unsigned long long)req->request_id, c->address, c->send_timeout_ms);
  return pec_fail(c, PE_C_ECONNECT, "%s (request %llu): send to %s: %s", what,
                  (unsigned long long)req->request_id, c->address, nn_strerror(e));
}

/* Wait up to wait_ms for a reply. Returns 0 with c->reply set, 1 when the
 * wait ran out, or a failure. The REQ socket already matches replies to
 * its last request at the nanomsg level, so a reply whose (client id,
 * request id) differ means a confused peer: reported, never taken as ours. */
static int recv_reply(pe_client *c, const char *what, const Pe__Request *req, int wait_ms) {
  int rc = set_int_opt(c, NN_SOL_SOCKET, NN_RCVTIMEO, wait_ms, "NN_RCVTIMEO");
  if (rc) return rc;
  void *msg = NULL;
  int n;
  while ((n = nn_recv(c->sock, &msg, NN_MSG, 0)) < 0 && nn_errno() == EINTR) {
  }
  if (n < 0) {
    int e = nn_errno();
    if (e == ETIMEDOUT || e == EAGAIN) return 1;
    return pec_fail(c, PE_C_ECONNECT, "%s (request %llu): receive from %s: %s", what,
                    (unsigned long long)req->request_id, c->address, nn_strerror(e));
  }
  Pe__Reply *r = pe__reply__unpack(NULL, (size_t)n, msg);
  nn_freemsg(msg);
  if (!r)
    return pec_fail(c, PE_C_EPROTO, "%s (request %llu): the %d-byte reply does not decode", what,
                    (unsigned long long)req->request_id, n);
  if (r->client_id != req->client_id || r->request_id != req->request_id) {
    rc = pec_fail(c, PE_C_EPROTO,
                  "%s (request %llu): reply ids (client %016llx, request %llu) do not match the "
                  "request's (client %016llx)",
                  what, (unsigned long long)req->request_id, (unsigned long long)r->client_id,
                  (unsigned long long)r->request_id, (unsigned long long)req->client_id);
    pe__reply__free_unpacked(r, NULL);
    return rc;
  }
  c->reply = r;
  if (r->max_message) { /* the daemon's limit: a larger request would go unanswered */
    c->daemon_max_message = (size_t)r->max_message;
    c->max_message =
        c->own_max_message < c->daemon_max_message ? c->own_max_message : c->daemon_max_message;
  }
  return 0;
}

/* While a reply is awaited from an ipc:// daemon, whether one still
 * listens on its socket is checked this often. */
#define LISTEN_CHECK_MS 1000

/* For an ipc:// address: NULL while a daemon listens on the socket; else
 * why none does (static text). A daemon that exits between reading its
 * last request and closing its socket leaves a request it never read
 * unanswered, and nanomsg would wait for a daemon to come back on that
 * path until the timeout; when one does, nanomsg sends the request to it
 * again by itself. A socket file that is gone (a clean exit) or refuses
 * (a crash) means no daemon will answer. */
static const char *no_listener(const pe_client *c) {
  if (strncmp(c->address, "ipc://", 6) != 0) return NULL;
  const char *path = c->address + 6;
  struct stat st;
  if (stat(path, &st) != 0) return "its socket file is gone";
  return connect_errno(path) == ECONNREFUSED ? "nothing listens on its socket" : NULL;
}

/* Pack once; send; every resend_ivl_ms without a reply send the same bytes
 * again (same ids: the daemon answers a resend from its reply cache or
 * waits for the original, never applies it twice), until timeout_ms. An
 * ipc:// daemon that went away before answering ends the wait at once
 * with SHUTTING_DOWN, as a draining daemon's answer would (no_listener):
 * the caller waits for a restart (pec_wait_restart). */
static int exchange(pe_client *c, const char *what, Pe__Request *req) {
  size_t size = pe__request__get_packed_size(req);
  if (size > c->max_message && c->max_message == c->daemon_max_message)
    return pec_fail(c, PE_C_ETOOBIG,
                    "%s: request is %zu bytes, over the daemon's max_message of %zu bytes (this "
                    "client's is %zu): send large feeds through shared memory (pe-client --feed "
                    "shm) or fewer per request, or raise max_message in the daemon's config",
                    what, size, c->daemon_max_message, c->own_max_message);
  if (size > c->max_message)
    return pec_fail(c, PE_C_ETOOBIG,
                    "%s: request is %zu bytes, over the maximum message size of %zu bytes "
                    "(NN_RCVMAXSIZE; raise max_message on both the daemon and the client, or "
                    "send large feeds through shared memory)",
                    what, size, c->max_message);
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf) return pec_fail(c, PE_C_ENOMEM, "%s: cannot allocate a %zu-byte message", what, size);
  pe__request__pack(req, buf);
  double deadline = now_ms() + c->timeout_ms, next_send = now_ms();
  bool ipc = strncmp(c->address, "ipc://", 6) == 0;
  int sends = 0, rc;
  for (;;) {
    double now = now_ms();
    if (now >= next_send) {
      if ((rc = send_packed(c, what, req, buf, size))) break;
      sends++;
      if (sends > 1) c->resent = true;
      next_send = c->resend_ivl_ms > 0 ? now + c->resend_ivl_ms : deadline;
    }
    double until = next_send < deadline ? next_send : deadline;
    if (ipc && until > now + LISTEN_CHECK_MS) until = now + LISTEN_CHECK_MS;
    int wait = until - now < 1 ? 1 : (int)(until - now);
    rc = recv_reply(c, what, req, wait);
    if (rc != 1) break;
    if (now_ms() >= deadline) {
      rc = pec_fail(c, PE_C_ETIMEDOUT,
                    "%s (request %llu): no reply from %s within %d ms, sent %d time(s) (daemon "
                    "down or busy, or the reply exceeded the %zu-byte maximum message size)",
                    what, (unsigned long long)req->request_id, c->address, c->timeout_ms, sends,
                    c->max_message);
      break;
    }
    const char *gone = ipc ? no_listener(c) : NULL;
    if (gone) {
      rc = pec_fail(c, PE_C_ESHUTDOWN,
                    "%s (request %llu): the daemon on %s went away before answering (%s)", what,
                    (unsigned long long)req->request_id, c->address, gone);
      break;
    }
  }
  free(buf);
  c->silent = rc == PE_C_ETIMEDOUT || rc == PE_C_ECONNECT;
  return rc;
}

static int call(pe_client *c, const char *what, Pe__Request *req, Pe__Reply__BodyCase want) {
  drop_results(c);
  c->err[0] = 0;
  if (c->sock < 0) return pec_fail(c, PE_C_ECONNECT, "%s: not connected", what);
  req->client_id = c->client_id;
  req->request_id = ++c->last_request_id;
  /* On this machine the daemon ends the session when this process exits
   * (kill -9 included); elsewhere the pid would mean nothing to it. */
  if (!c->outlive_process && !strncmp(c->address, "ipc://", 6)) {
    if (c->pid != (long)getpid()) pe_shm_owner_self(&c->pid, &c->pid_start);
    req->client_pid = (uint32_t)c->pid;
    req->client_start = c->pid_start;
  }
  int rc = exchange(c, what, req);
  if (rc) return rc;
  Pe__Reply *r = c->reply;
  if (r->code != 0) {
    /* The daemon's code and message as they came (message names op, var,
     * shape), prefixed with the request unless the daemon already did. */
    const char *msg = r->message && *r->message ? r->message : pe_client_code_name(r->code);
    size_t wl = strlen(what);
    bool named = strncmp(msg, what, wl) == 0 && msg[wl] == ':';
    pec_fail(c, r->code, "%s%s%s", named ? "" : what, named ? "" : ": ", msg);
    return r->code;
  }
  if (want != PE__REPLY__BODY__NOT_SET && r->body_case != want)
    return pec_fail(c, PE_C_EPROTO, "%s (request %llu): reply carries a %s body, expected %s", what,
                    (unsigned long long)req->request_id, body_name(r->body_case), body_name(want));
  return 0;
}

/* Counted in in_call before stopped is read (both seq_cst), while
 * pe_client_interrupt sets stopped before it reads in_call: either this
 * call sees stopped, or the interrupt waits for it. */
int pec_call(pe_client *c, const char *what, Pe__Request *req, Pe__Reply__BodyCase want) {
  PEC_NEED_HANDLE(c);
  atomic_fetch_add(&c->in_call, 1);
  int rc = atomic_load(&c->stopped)
               ? pec_fail(c, PE_C_EARG,
                          "%s: not sent: this handle was interrupted (its session is being "
                          "ended)",
                          what)
               : call(c, what, req, want);
  atomic_fetch_sub(&c->in_call, 1);
  return rc;
}
