/* Shared by client*.c: the handle and the one request/reply exchange. */
#ifndef PE_CLIENT_INTERNAL_H
#define PE_CLIENT_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "pe_client.h"
#include "service.pb-c.h"
#include "shm_token.h"

#define PEC_ADDR_LEN 512
#define PEC_ERR_LEN 2048

struct pe_client {
  int sock; /* nanomsg REQ socket, -1 before connect */
  char address[PEC_ADDR_LEN];
  uint64_t client_id;
  uint64_t last_request_id;                       /* ids start at 1 and only grow */
  int timeout_ms, send_timeout_ms, resend_ivl_ms; /* resend_ivl_ms 0: never */
  int restart_wait_ms; /* after a SHUTTING_DOWN reply; < 0: none (client_recover.c) */
  bool resent;         /* a request went out twice: never nn_close (client.c) */
  /* The last request got no reply (timed out, or the socket failed); a
   * reply clears it. Clean-up requests (close, unregister_shm) are not
   * sent while it is set: each would wait a whole timeout more for a daemon
   * that is gone, and the daemon drops the session and its regions itself
   * (the client's process exiting, or the TTL). */
  bool silent;
  /* pe_client_interrupt (another thread): once stopped is set, pec_call
   * sends nothing; in_call counts the pec_calls under way, for it to wait
   * until the request in flight is answered. */
  atomic_bool stopped;
  atomic_int in_call;
  /* This process (Request.client_pid, client_start), sent on ipc://
   * only and not with opts.outlive_process; looked up again after a fork. */
  bool outlive_process;
  long pid;
  uint64_t pid_start;
  /* The uid that owns the daemon's ipc:// socket file (the daemon's user),
   * learnt at connect; shared-memory regions are opened to it (shm_grant.c). */
  bool daemon_uid_known;
  uid_t daemon_uid;
  size_t max_message;        /* min(own limit, daemon_max_message when known) */
  size_t own_max_message;    /* opts / $PE_MAX_MESSAGE / the default */
  size_t daemon_max_message; /* from the replies (Reply.max_message); 0: not known yet */
  /* The last reply and the result arrays built from it; both are freed at
   * the start of the next request (results point into the reply). */
  Pe__Reply *reply;
  void *results;
  char *trace; /* NUL-terminated copy of the last trace */
  char err[PEC_ERR_LEN];
  /* What was registered, to register it again (client_recover.c). */
  bool no_recover, fail_on_rollback;
  struct pec_prog *progs;
  struct pec_region *regions;
  pe_client_recovery recovery;
};

/* Record a failure in c->err ("what: message") and return code. */
int pec_fail(pe_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A NULL handle: every call that takes one returns PE_C_EARG (there is no
 * handle to keep a message in; pe_client_error(NULL) says so). */
#define PEC_NEED_HANDLE(c)      \
  do {                          \
    if (!(c)) return PE_C_EARG; \
  } while (0)

/* pe_client_tensor_set's mark for a NULL shape with ndim > 0 (shape[0]),
 * refused when the tensor is sent. */
#define PEC_NO_SHAPE INT64_MIN

/* Send req (ids are filled here) and wait for its reply. On success the
 * reply is c->reply, its code is 0 and its body is `want` (NOT_SET: any).
 * `what` names the request in every error message. */
int pec_call(pe_client *c, const char *what, Pe__Request *req, Pe__Reply__BodyCase want);

/* Give the daemon's user read access to the shared-memory object fd (name
 * for messages) when the daemon runs as another user: one POSIX ACL entry
 * for that uid only; the owner keeps rw and nobody else gets anything.
 * Nothing to do when the daemon is this process's user, root or unknown. */
int pec_shm_grant_daemon(pe_client *c, int fd, const char *name);

/* Region trailers (shm_trailer.c, common/shm_token.h). pec_shm_seal_fd:
 * grow fd to size + PE_SHM_TRAILER and write a fresh token there (-1,
 * errno set, on failure). pec_shm_read_token: the token of name's trailer
 * at byte size; *have false (and 0) when the object cannot be opened (the
 * daemon then answers as for anyone without it), an error when it can but
 * holds no trailer. */
int pec_shm_seal_fd(int fd, size_t size, uint8_t token[PE_SHM_TOKEN_LEN]);
int pec_shm_read_token(pe_client *c, const char *name, uint64_t size,
                       uint8_t token[PE_SHM_TOKEN_LEN], bool *have);
/* RegisterShm with token (NULL: none) and remember the region with it
 * (recovery registers it again with the same token). */
int pec_register_shm(pe_client *c, const char *name, uint64_t size,
                     const uint8_t token[PE_SHM_TOKEN_LEN], uint64_t *region);

/* Recovery from lost programs (client_recover.c). Remember a registered
 * program (a copy of its arguments) or region; forget it at deregister or
 * unregister. pec_prog_answered records an answered run (request id,
 * steps) of a program. pec_region_now maps the region id a caller holds
 * to the daemon's current one. */
int pec_prog_remember(pe_client *c, const pe_client_register_args *a, uint64_t handle);
void pec_prog_forget(pe_client *c, uint64_t handle);
/* Forget every remembered program of model (it was dropped). */
void pec_prog_forget_model(pe_client *c, const char *model);
void pec_prog_answered(pe_client *c, uint64_t handle, uint64_t request, uint32_t steps);
int pec_region_remember(pe_client *c, const char *name, uint64_t size,
                        const uint8_t token[PE_SHM_TOKEN_LEN], uint64_t id);
void pec_region_forget(pe_client *c, uint64_t given);
uint64_t pec_region_now(const pe_client *c, uint64_t given);
void pec_recover_free(pe_client *c);
/* After `request` (a run's id, 0 for other requests; its program: handle, or the first remembered
 * one of model when model is not NULL) failed with code: when code is NOT_FOUND and the program is
 * remembered, register the regions and the program again. Returns 0 when the request should be sent
 * again; else a failure (code with c->err kept or extended; ALREADY_APPLIED when the restored
 * parameters include the request; ROLLED_BACK for a run when
 * fail_on_rollback is set and answered runs were rolled back; with
 * need_values, NOT_FOUND when the model came back without values). */
int pec_recover(pe_client *c, const char *what, int code, uint64_t handle, const char *model,
                uint64_t request, bool need_values);
/* After a SHUTTING_DOWN reply (c->reply, c->err): wait up to
 * c->restart_wait_ms for a daemon to answer again on the address. Returns
 * NOT_FOUND when one does (a restarted daemon has none of this client's
 * programs: pec_recover's case), else SHUTTING_DOWN with the daemon's
 * reply kept in c->reply and its message in c->err. */
int pec_wait_restart(pe_client *c);

/* Result storage owned by the handle until the next request. */
void *pec_results_alloc(pe_client *c, size_t bytes);

/* t's name, dtype, dims and byte count (and data, with need_data) as a
 * request or a file takes them; -1 with the reason in err, prefixed by
 * what. */
int pec_tensor_check(const char *what, const pe_client_tensor *t, bool need_data, char *err,
                     size_t errlen);

/* pe_client_tensor <-> Pe__Tensor. to_pb: t_pb and shape storage provided by
 * the caller (shape of PE_CLIENT_MAX_DIMS), data is not copied. from_pb
 * checks dims and byte counts. Both return 0 or a failure via pec_fail. */
int pec_tensor_to_pb(pe_client *c, const char *what, const pe_client_tensor *t, Pe__Tensor *pb,
                     int64_t *shape, Pe__ShmRef *shm);
int pec_tensors_from_pb(pe_client *c, const char *what, Pe__Tensor *const *pbs, size_t n,
                        const pe_client_tensor **out);

#endif
