/* libpeclient's connection to pe-executord: one nanomsg REQ socket per
 * handle, one request in flight at a time (proto/service.proto).
 *
 * Errors are values: every call that talks to the daemon returns a
 * pe_client_code (0 = OK). Codes below PE_C_CLIENT_BASE are the daemon's
 * (pe_code in daemon/core/status.h, same numbers); codes from
 * PE_C_CLIENT_BASE up are raised on this side (timeout, no daemon, request
 * over the size limit, a reply that does not decode). pe_client_error gives
 * the last failure's message: the daemon's own message for daemon errors,
 * prefixed with the request's name ("run: ...").
 *
 * Requests: each handle has a random 64-bit client id and numbers its
 * requests 1, 2, ...; the daemon deduplicates by that pair, so a resent
 * request is never applied twice. nanomsg resends a request when the
 * connection to the daemon comes back (a restarted daemon), and a request
 * whose program the daemon has lost registers it again (pe_client_recovery,
 * below) and is sent once more, still applied at most once. Timed resends
 * are off by default: nanomsg's NN_REQ_RESEND_IVL timer is switched off
 * because in nanomsg 1.1.5 resends corrupt the socket (lib/client.c); with
 * opts.resend_ivl_ms the client resends itself, and such a handle keeps its
 * socket open until exit. A reply whose ids do not match is refused
 * (EPROTO).
 *
 * Size limit: requests are packed first and refused here, with both sizes,
 * when larger than max_message (the daemon's NN_RCVMAXSIZE would drop them
 * silently): opts.max_message, and once a reply has come, the daemon's own
 * if that is smaller (every reply carries it). NN_RCVMAXSIZE is set to
 * opts.max_message on this socket.
 *
 * Results (registered params, fetched tensors, status) point into the last
 * reply, which the handle owns: they stay valid until the next request on
 * the same handle or pe_client_free.
 *
 * Threads: a handle is not shared; use one handle per thread (handles share
 * nothing).
 *
 * NULL arguments: a pointer may be NULL only where its comment says so
 * ("may be NULL"; pe_client_free, pe_client_error and pe_client_shm_close
 * take a NULL handle). A NULL handle makes every other call that returns a
 * code fail with PE_C_EARG (BAD_CLIENT_ARGUMENT; pe_client_error(NULL)
 * says "no client handle"), and the accessors return "" or 0. Any other
 * NULL (an out-pointer, an array with a count above 0, a NULL entry of a
 * name array) fails with PE_C_EARG naming the argument ("run: fetch 1 of 1
 * is NULL", "run: 2 feeds but no array"), before anything is sent. */
#ifndef PE_CLIENT_H
#define PE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pe_builder.h" /* pe_b_dtype: the element types (proto DataType values) */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pe_client_code {
  /* The daemon's codes (pe_code, daemon/core/status.h). */
  PE_C_OK = 0,
  PE_C_EINVAL = 1,
  PE_C_ENOMEM = 2,
  PE_C_ENOTFOUND = 3,
  PE_C_EUNKNOWN_OP = 4,
  PE_C_EUNKNOWN_VAR = 5,
  PE_C_EATTR = 6,
  PE_C_EARITY = 7,
  PE_C_ESHAPE = 8,
  PE_C_EDTYPE = 9,
  PE_C_EUSE_BEFORE_DEF = 10,
  PE_C_ECYCLE = 11,
  PE_C_EMISSING_FEED = 12,
  PE_C_EIO = 13,
  PE_C_ECORRUPT = 14,
  PE_C_ENOGRAD = 15,
  PE_C_EBACKEND = 16,
  PE_C_EINTERNAL = 17,
  /* A resend of a run the model already has (after a daemon restart from a
   * checkpoint that includes it, or once its cached reply was evicted): not
   * applied again; the message says how many of its steps reached it. */
  PE_C_EALREADY = 18,
  /* A request on another client's program that only its owners may make
   * (deregister without force). */
  PE_C_EPERM = 19,
  /* A daemon limit shared by all clients is reached (config [limits]
   * max_programs): not this request's fault; retry later. */
  PE_C_EEXHAUSTED = 20,
  /* The daemon stopped a run at its pe_client_run_opts.timeout_ms (the
   * steps before stay applied; the result's steps counts them). */
  PE_C_EDEADLINE = 21,
  /* The daemon is shutting down (SIGTERM/SIGINT): the request was not done
   * (a run stopped at a step boundary: the steps it applied are counted),
   * and the daemon takes no more requests (see opts.restart_wait_ms). */
  PE_C_ESHUTDOWN = 22,
  /* Raised by the client. */
  PE_C_CLIENT_BASE = 100,
  PE_C_ETIMEDOUT = 100, /* no reply within the receive timeout */
  PE_C_ECONNECT = 101,  /* bad address, no daemon socket, socket error */
  PE_C_ETOOBIG = 102,   /* request larger than max_message */
  PE_C_EPROTO = 103,    /* reply that does not decode or does not match */
  PE_C_EARG = 104,      /* bad argument to a pe_client call */
  /* A run not sent after a recovery that rolled back runs this handle had
   * answered (opts.fail_on_rollback; see pe_client_recovery). */
  PE_C_EROLLEDBACK = 105,
} pe_client_code;

/* "OK", "SHAPE_MISMATCH", ..., "TIMED_OUT"; "UNKNOWN_CODE" otherwise. */
const char *pe_client_code_name(int code);

#define PE_CLIENT_MAX_MESSAGE_DEFAULT (64u << 20) /* the daemon's default */
#define PE_CLIENT_MAX_DIMS 8

typedef struct pe_client_opts {
  const char *address; /* NULL: $PE_SOCKET, else pe_client_default_address */
  int timeout_ms;      /* reply wait per request; 0: $PE_TIMEOUT_MS or 60000 */
  int send_timeout_ms; /* 0: 5000 */
  /* Resend the same request after this long without a reply; 0: never.
   * Each resend supersedes the last, so keep it well above the daemon's
   * reply latency (seconds), or replies keep arriving too late. */
  int resend_ivl_ms;
  size_t max_message; /* 0: $PE_MAX_MESSAGE or PE_CLIENT_MAX_MESSAGE_DEFAULT */
  /* Do not recover lost programs (see pe_client_recovery_info): a request
   * whose program the daemon no longer has fails with NOT_FOUND. */
  bool no_recover;
  /* When a recovery finds that the restore rolled back runs this handle
   * had answered, do not send the lost run on top of the older parameters:
   * it fails with PE_C_EROLLEDBACK, and pe_client_recovery_info says where
   * the parameters stand, for the caller to repeat its work from there
   * (pe-client train rewinds its data). Without it the run is sent and the
   * rolled-back runs are only counted. */
  bool fail_on_rollback;
  /* On ipc:// each request carries this process's pid and start time, and
   * the daemon ends the session (its programs, a non-persistent model only
   * they use, its regions) within a second or two of the process exiting.
   * With outlive_process they are not sent: the session lasts until
   * pe_client_close or the daemon's session TTL (idle time), as over tcp://.
   * For a process that registers programs for later processes to use
   * (pe-client register, run, trace). */
  bool outlive_process;
  /* Continue the session of another handle, of an earlier process of this
   * user (pe-client register, then deregister): its pe_client_id and its
   * pe_client_last_request_id. The requests go under that client id,
   * numbered after that request, so that the daemon takes this handle for
   * the owner of what the session registered and its reply cache answers
   * none of them with an earlier reply. 0: a new random client id. */
  uint64_t session_client_id;
  uint64_t session_last_request;
  /* After a SHUTTING_DOWN reply (the daemon is stopping: SIGTERM, systemctl
   * stop or restart), how long to wait for a daemon to answer again on the
   * same address before the request fails with that reply. A daemon that
   * answers within it (a restart) gets the program registered again and
   * the request sent again, as after any restart. 0: $PE_RESTART_WAIT_MS,
   * else 10000; negative: fail at once. */
  int restart_wait_ms;
} pe_client_opts;

/* The daemon's default socket: ipc:///run/pe-executord/pe-executord.sock as
 * root, else ipc://$XDG_RUNTIME_DIR/pe-executord.sock, else
 * ipc:///tmp/pe-executord-$UID.sock. Writes at most len bytes (none when buf
 * is NULL or len 0); returns buf. */
char *pe_client_default_address(char *buf, size_t len);

typedef struct pe_client pe_client;

/* A handle; NULL only when out of memory. Not connected yet. */
pe_client *pe_client_new(void);
void pe_client_free(pe_client *c);
/* Open the REQ socket and connect (opts may be NULL: all defaults). For an
 * ipc:// address whose socket file does not exist, is not a socket, is not
 * writable by this user (permission denied, naming its mode and group) or
 * has nobody listening (a stale socket of a daemon that exited), fails with
 * ECONNECT at once rather than timing out later. An address that is not
 * one (no or an unknown transport, a bad host:port) fails with EARG. */
int pe_client_connect(pe_client *c, const pe_client_opts *opts);
/* The last failure's message ("" after a success). */
const char *pe_client_error(const pe_client *c);
const char *pe_client_address(const pe_client *c);
uint64_t pe_client_id(const pe_client *c);
/* The id of the last request sent (0 before the first): with the client id,
 * the key the daemon logs a request under and deduplicates it by. */
uint64_t pe_client_last_request_id(const pe_client *c);
/* The largest request this handle sends: min(opts.max_message, the
 * daemon's max_message once a reply has said it). */
size_t pe_client_max_message(const pe_client *c);
/* Change the reply timeout for later requests (ms, > 0). */
int pe_client_set_timeout(pe_client *c, int timeout_ms);

/* --- tensors ------------------------------------------------------------------- */

/* A named tensor. As a feed: data points to nbytes (= numel * dtype size)
 * little-endian row-major bytes the caller owns, or, with shm_region != 0,
 * the bytes are at shm_offset in a RegisterShm region (data unused). As a
 * result: data points into the handle's last reply. */
typedef struct pe_client_tensor {
  const char *name;
  pe_b_dtype dtype;
  int ndim;
  int64_t shape[PE_CLIENT_MAX_DIMS];
  const void *data;
  size_t nbytes;
  uint64_t shm_region, shm_offset;
  /* With shm_region, a feed may name rows instead of bytes: shm_offset
   * starts an array of shm_array_rows rows of the tensor's row size (the
   * bytes of one index of dim 0), and the tensor's row i is its row
   * shm_rows[i] (shape[0] indices). A trainer keeps its data set in a
   * region once and sends each batch as indices: the daemon copies the
   * rows. NULL: the bytes lie at shm_offset as they are. */
  const int64_t *shm_rows;
  int64_t shm_array_rows;
} pe_client_tensor;

/* Element size of dtype; 0 for an unknown one. */
size_t pe_client_dtype_size(pe_b_dtype dt);
const char *pe_client_dtype_name(pe_b_dtype dt);
/* Product of the dims; -1 when ndim is outside 0..PE_CLIENT_MAX_DIMS. */
int64_t pe_client_tensor_numel(const pe_client_tensor *t);
/* Fill t as a feed over caller-owned data (nbytes from dtype and shape).
 * shape may be NULL when ndim is 0; otherwise a NULL shape (or an ndim
 * out of range) is kept and the tensor refused when sent, naming it. */
void pe_client_tensor_set(pe_client_tensor *t, const char *name, pe_b_dtype dt, int ndim,
                          const int64_t *shape, const void *data);
/* First result called name, or NULL (also when ts or name is NULL). */
const pe_client_tensor *pe_client_find(const pe_client_tensor *ts, size_t n, const char *name);

/* --- requests ------------------------------------------------------------------- */

int pe_client_ping(pe_client *c);

/* Gradient strategy across the places (docs/architecture.md): all-reduce +
 * an optimizer per place, reduce to an owner + broadcast, or sharded (one
 * sliced optimizer update per parameter; cpu and sim places). The default,
 * auto, is the daemon's choice: sharded on cpu and sim places (the same
 * results as all-reduce, bit for bit, and faster), all-reduce on cuda. */
typedef enum pe_client_strategy {
  PE_C_STRATEGY_AUTO = 0,
  PE_C_ALLREDUCE = 1,
  PE_C_REDUCE = 2,
  PE_C_SHARDED = 3
} pe_client_strategy;
/* "auto", "allreduce", "reduce", "sharded"; "unknown" otherwise. */
const char *pe_client_strategy_name(pe_client_strategy s);

/* RegisterOptions.cuda_graph (docs/cuda.md, "Captured steps"). */
typedef enum pe_client_cuda_graph {
  PE_C_CUDA_GRAPH_DAEMON = 0, /* the daemon's [runtime] cuda_graph */
  PE_C_CUDA_GRAPH_AUTO,
  PE_C_CUDA_GRAPH_ON,
  PE_C_CUDA_GRAPH_OFF,
} pe_client_cuda_graph;

typedef struct pe_client_register_args {
  const uint8_t *program; /* ProgramDesc bytes (pe_builder_finish) */
  size_t program_len;
  const char *model;  /* parameter namespace (required) */
  const char *places; /* NULL/"": the daemon's places */
  pe_client_strategy strategy;
  const char *loss; /* NULL: the program's */
  uint64_t seed;    /* 0: 1 */
  bool for_test;    /* evaluation program: no backward, no optimizer */
  bool persistent;  /* the model outlives its clients */
  bool fuse_allreduce;
  int64_t fuse_bucket_bytes;
  const char *sync;        /* NULL: the daemon's ("event" | "producer") */
  const char *const *keep; /* n_keep names kept fetchable; may be NULL when n_keep is 0 */
  size_t n_keep;
  bool no_op_fusion; /* keep conv2d / matmul + bias add + relu unfused (RegisterOptions) */
  /* The batch the caller feeds: a daemon with places = auto times its
   * candidate places with it (0: the daemon's places_trial_batch). */
  int64_t batch_hint;
  pe_client_cuda_graph cuda_graph; /* steps on cuda places as CUDA graphs; 0: the daemon's */
  /* A job across nodes (docs/multinode.md): job names it (NULL: none);
   * every node registers the same program with its own daemon, the same
   * job, world, rendezvous and token and its own rank. The register
   * returns once every node joined (or fails naming the node, the
   * variable that differs, or the peer that did not come). */
  const char *job;
  int job_world;              /* nodes, >= 2 */
  int job_rank;               /* this node, 0 .. job_world-1 */
  const char *job_rendezvous; /* rank 0's daemon listens there, "HOST:PORT" */
  const char *job_token;      /* the job's shared secret */
} pe_client_register_args;

typedef struct pe_client_param {
  const char *name;
  pe_b_dtype dtype;
  int ndim;
  int64_t shape[PE_CLIENT_MAX_DIMS];
} pe_client_param;

/* One configuration a places = auto trial timed (docs/architecture.md,
 * "Places by measurement"): its median step, or why it did not run. */
typedef struct pe_client_places_candidate {
  const char *places; /* "cpu:2" */
  pe_client_strategy strategy;
  bool fused;
  double step_ms; /* 0: not measured */
  const char *error;
} pe_client_places_candidate;

/* How places = auto chose a model's places (present false: they were
 * named, or the daemon's). Strings valid until the next request. */
typedef struct pe_client_places_trial {
  bool present;
  const char *places;
  pe_client_strategy strategy;
  bool fused;
  bool remembered; /* the daemon's remembered choice: nothing timed */
  int64_t batch;
  double trial_s;
  size_t n_candidates;
  const pe_client_places_candidate *candidates;
} pe_client_places_trial;

typedef struct pe_client_program {
  uint64_t handle;
  bool existed;                /* the same program and options were registered before */
  bool has_values;             /* every parameter of the model has a value */
  pe_client_strategy strategy; /* as compiled (auto resolved) */
  char places[32];             /* the model's places, KIND:COUNT ("cpu:2"; "" from an old daemon) */
  /* This client's newest request whose run reached the model's parameters
   * (0: none) and how many of its steps did; after a daemon restart, as
   * restored from the model's checkpoint. */
  uint64_t applied_request;
  uint32_t applied_steps;
  size_t n_params;
  const pe_client_param *params;       /* valid until the next request */
  pe_client_places_trial places_trial; /* the model's, valid until the next request */
} pe_client_program;

/* out: required. */
int pe_client_register(pe_client *c, const pe_client_register_args *a, pe_client_program *out);

/* Recovery. When the daemon no longer has a program this handle registered
 * (it restarted, or the session expired), a request on it (run, init, or
 * get/set params, save, load of its model) registers the handle's
 * shared-memory regions and the program again and is sent once more, with
 * a new request id. A persistent model comes back from its restart
 * checkpoint; the register reply says which of this client's runs that
 * includes, so a run is never applied twice:
 *   - the request itself reached the parameters before the loss: it is not
 *     sent again; it fails with ALREADY_APPLIED (its fetches are lost);
 *   - runs answered before but newer than the checkpoint were rolled back
 *     (counted below, for a trainer to report or repeat); with
 *     opts.fail_on_rollback the request is then not sent: it fails with
 *     ROLLED_BACK, so that the caller can repeat from where the parameters
 *     stand (its steps answered so far, less rolled_back_steps; after
 *     ALREADY_APPLIED, the request's start plus applied_steps);
 *   - a model that came back without parameters (not persistent, or no
 *     checkpoint) is not run: NOT_FOUND says to register and init again;
 *   - a register again that gets no reply, or cannot connect, fails with
 *     that code (TIMED_OUT, CONNECTION_ERROR), the first NOT_FOUND named in
 *     the message.
 * Ids the caller holds (handles, regions) stay valid. Off with
 * opts.no_recover. */
typedef struct pe_client_recovery {
  uint64_t recoveries; /* programs registered again so far */
  /* The last one: */
  uint64_t handle;
  uint64_t applied_request; /* as in pe_client_program */
  uint32_t applied_steps;
  /* Answered runs of the program (and their steps) that its parameters no
   * longer include (the newest 4096 runs are remembered). */
  uint64_t rolled_back_runs, rolled_back_steps;
  /* The counts cover every rolled-back run: false when the parameters are
   * older than the oldest run remembered. */
  bool rolled_back_exact;
} pe_client_recovery;
void pe_client_recovery_info(const pe_client *c, pe_client_recovery *out); /* zeros for NULL c */

/* Run the startup program unless the model has every persistable the
 * program declares (force: do it anyway, resetting them all). When the model
 * has some (it was trained by another program; this one adds an optimizer's
 * state or a schedule's counter), only the missing ones are initialised: the
 * others keep their values, learning_rate excepted (this program's).
 * learning_rate is this program's also when the model has every value (a
 * fine-tuning run at another rate trains at it; *initialized stays false),
 * unless the program has a schedule, whose op sets the rate from its own
 * base before each step.
 * *initialized (may be NULL) tells whether the startup ran for values the
 * model lacked (a model with values gets the new ones only: compare
 * pe_client_program.has_values from the register before). A forced init
 * is refused (PE_C_EPERM, naming the programs and their clients) while
 * another live client's program uses the model: it would reset their
 * training under them. pe_client_init_force_in_use resets it anyway (an
 * operator's tool, as pe_client_deregister_force). */
int pe_client_init(pe_client *c, uint64_t handle, bool force, bool *initialized);
int pe_client_init_force_in_use(pe_client *c, uint64_t handle, bool *initialized);
/* After an Init that initialised (*initialized true): the persistables it
 * gave values (all the program's with force; else those the model lacked,
 * e.g. a new optimizer's state), in *names; their count is returned. 0
 * (and NULL) when the last reply is not an Init's. Valid until c's next
 * request. */
size_t pe_client_init_added(const pe_client *c, const char *const **names);

typedef struct pe_client_run_opts {
  uint32_t steps; /* 0: 1 */
  /* > 1: every feed holds this many mini-batches of equal size along dim 0;
   * the daemon runs one step per mini-batch in order (steps 0 or equal) and
   * each fetched tensor is every step's value, [batches, shape...]. A step
   * that fails stops the run: the steps before it stay applied (the error
   * says "steps 0..k-1 stay applied"; the result's steps counts them). */
  uint32_t batches;
  bool trace;
  uint32_t timeout_ms; /* daemon-side run timeout; 0: none */
  int32_t priority;
  /* Debug (PaddlePaddle's FLAGS_check_nan_inf): the daemon checks every
   * op's outputs and the feeds for NaN/Inf and fails the run (PE_C_EINVAL)
   * at the first op that writes one, naming the op type and index, its
   * output, the first bad element, the inputs that were non-finite already
   * and the step. Slower; cpu and sim places only. */
  bool check_nan_inf;
} pe_client_run_opts;

typedef struct pe_client_run_result {
  size_t n_fetched;
  const pe_client_tensor *fetched; /* valid until the next request */
  double run_ms, queue_ms;
  /* Steps applied; also set when the run failed after applying some (its
   * timeout_ms reached: PE_C_EDEADLINE; cancelled; step k failing). */
  uint32_t steps;
  const char *trace_json; /* NUL-terminated copy when traced, else NULL */
  size_t trace_len;
} pe_client_run_result;

/* feeds: n_feeds tensors, fetch: n_fetch names (each may be NULL only when
 * its count is 0); opts and out may be NULL. */
int pe_client_run(pe_client *c, uint64_t handle, const pe_client_tensor *feeds, size_t n_feeds,
                  const char *const *fetch, size_t n_fetch, const pe_client_run_opts *opts,
                  pe_client_run_result *out);

/* names NULL / n_names 0: all parameters of the model. values and n_values
 * are required. set_params: values may be NULL only when n_values is 0.
 * set_params sets variables the model's programs declare (or the model
 * holds): another name is PE_C_EUNKNOWN_VAR, and nothing of the request is
 * set. */
int pe_client_get_params(pe_client *c, const char *model, const char *const *names, size_t n_names,
                         const pe_client_tensor **values, size_t *n_values);
int pe_client_set_params(pe_client *c, const char *model, const pe_client_tensor *values,
                         size_t n_values);

/* Checkpoints under the daemon's state directory; name [A-Za-z0-9._-]{1,64},
 * not starting with '.'. path and bytes may be NULL; *path is valid until the
 * next request. */
int pe_client_save(pe_client *c, const char *model, const char *name, const char **path,
                   uint64_t *bytes);
int pe_client_load(pe_client *c, const char *model, const char *name, const char **path,
                   uint64_t *bytes);
/* Drop this client's registration of a program: the program (and a
 * non-persistent model only it used) goes once no client owns it. A
 * program this client never registered is refused with PE_C_EPERM (other
 * trainers' runs depend on it); pe_client_deregister_force drops it for
 * every owner anyway (an operator's tool: their runs then fail NOT_FOUND). */
int pe_client_deregister(pe_client *c, uint64_t handle);
int pe_client_deregister_force(pe_client *c, uint64_t handle);

typedef struct pe_client_drop_result {
  bool freed;          /* a model in the daemon was freed */
  const char *removed; /* its restart checkpoint, removed ("": none); until the next request */
  int programs;        /* this handle's programs of the model, deregistered */
} pe_client_drop_result;
/* Free model `model` in the daemon and remove its restart checkpoint (the
 * file a daemon restart restores a persistent model from), so that the name
 * starts afresh: to register a program of other parameter shapes under it,
 * or to discard what a persistent model holds. Named checkpoints (Save)
 * stay. Refused (PE_C_EPERM, naming each program's handle and client)
 * while a program of another live client uses the model; this handle's own
 * programs of it are deregistered. A model not loaded in the daemon (after a
 * restart) has its restart checkpoint removed; neither: PE_C_ENOTFOUND. out
 * may be NULL. */
int pe_client_drop_model(pe_client *c, const char *model, pe_client_drop_result *out);
/* End this client's session now rather than at the daemon's session TTL
 * (idle clients are reclaimed after it, 600 s by default): the daemon
 * deregisters every program this handle registered, freeing a
 * non-persistent model that no other client's program uses (a persistent
 * one stays, with its values), and unregisters its shared-memory regions.
 * A trainer calls it when done, so that its memory is given back and the
 * next trainer of the same model name starts afresh. pe_client_free alone
 * sends nothing: the session then lasts until the process exits (ipc://)
 * or, with opts.outlive_process or over tcp://, until the TTL, which is
 * how a program registered by one process (`pe-client register`) is used
 * by the next. The handle stays usable; its programs are forgotten (no recovery
 * registers them again), and a later request opens a new session.
 * Idempotent. */
int pe_client_close(pe_client *c);
/* End c's session from another thread while c may be in a request: what a
 * program does on Ctrl-C or kill (pe-client train and eval, from a thread
 * that a signal handler wakes), where the daemon would otherwise keep the
 * session until its TTL (a tcp:// client; on ipc:// the daemon also sees
 * the process exit). From now on c sends nothing: each call fails with
 * PE_C_EARG ("interrupted"). The request c has in flight gets up to wait_ms
 * to be answered (a later one would be refused anyway); then a close for
 * c's session goes out on a connection of its own, waiting up to
 * timeout_ms for its reply. Not async-signal-safe; touches only what
 * pe_client_connect set and atomics of c, so c's own thread may go on (and
 * fail). c must stay allocated until it returns. Returns 0, or the close's
 * failure code with its message in err (errlen bytes; err may be NULL). */
int pe_client_interrupt(pe_client *c, int wait_ms, int timeout_ms, char *err, size_t errlen);

typedef struct pe_client_place_status {
  const char *place;
  int64_t bytes_in_use, bytes_cached;
} pe_client_place_status;

typedef struct pe_client_model_status {
  const char *name;
  int programs;
  int64_t param_bytes;
  bool persistent;
  /* Checkpoints since the daemon started (Save, autosave, SIGTERM): written
   * and failed; the newest written one's name ("" none) and age (-1 none);
   * the newest failure's message ("" none); changes (runs, sets, loads)
   * since the newest written one's values (-1 none). */
  uint64_t checkpoints_saved, checkpoint_failures;
  const char *last_checkpoint;
  double last_checkpoint_age_s;
  const char *last_checkpoint_error;
  int64_t changes_since_checkpoint;
  /* The restart checkpoint (the one a crash restarts from: autosave,
   * SIGTERM): its name, the age of its values (-1: not written or read
   * since the daemon started) and the changes since (-1: unknown), what a
   * crash would lose; read: the age counts from its restore or a Load. */
  const char *restart_checkpoint;
  double restart_checkpoint_age_s;
  int64_t changes_since_restart_checkpoint;
  bool restart_checkpoint_read;
  pe_client_places_trial places_trial; /* how places = auto chose its places */
} pe_client_model_status;

/* A Run request the daemon is computing: whose, on which model and
 * program, steps ended of those asked for, seconds since it was taken up. */
typedef struct pe_client_run_status {
  uint64_t client_id; /* this handle's own runs; 0 for another client's */
  const char *client; /* "c-" and 8 hex digits: the tag the daemon's log gives the client */
  const char *model;
  uint64_t handle;
  uint32_t steps_done, steps_total;
  double age_s;
} pe_client_run_status;

/* A request lane of the daemon: "work" (register, init, get/set params,
 * save, load), "control" (ping, status, close, deregister, drop_model,
 * shared-memory regions) or "run" (runs), its threads, those busy (this
 * Status not counted) and the requests waiting for one. */
typedef struct pe_client_lane_status {
  const char *name;
  int threads, busy, queued;
} pe_client_lane_status;

typedef struct pe_client_status {
  const char *version;
  double uptime_s;
  size_t n_places, n_models;
  const pe_client_place_status *places; /* valid until the next request */
  const pe_client_model_status *models;
  int programs, queue_depth, clients, worker_threads;
  uint64_t requests_total, requests_failed, runs_total;
  /* Resends (see proto/service.proto StatusReply) */
  uint64_t reply_cache_entries, reply_cache_bytes;
  uint64_t resends_answered, resends_waited, resends_stale, reply_cache_evictions;
  double checkpoint_interval_s; /* the autosave interval (0: off) */
  int runs_in_flight;           /* Run requests being computed now */
  size_t n_runs;                /* those runs, oldest first (valid until the next request) */
  const pe_client_run_status *runs;
  size_t n_lanes; /* work, control, run (valid until the next request) */
  const pe_client_lane_status *lanes;
  /* The daemon's resident memory, and its host allocator's bytes handed
   * out and cached (places' bytes_in_use count parameters only). */
  uint64_t rss_bytes, host_bytes_in_use, host_bytes_cached;
  /* The temporaries' bytes the runs in flight reserved from the daemon's
   * [limits] memory_runs_total, and the runs waiting for it. */
  uint64_t run_bytes_reserved;
  int runs_waiting_for_memory;
  /* The daemon's memory budget ([limits] memory_total; 0: unlimited) and
   * what is resident in it: models' persistables on every place, kept
   * temporaries (0 from older daemons). */
  uint64_t memory_total_bytes, memory_resident_bytes;
  /* Whether steps on the daemon's default places run as captured CUDA
   * graphs, and why not ("" when they do; valid until the next request). */
  bool cuda_graph;
  const char *cuda_graph_reason;
} pe_client_status;

int pe_client_get_status(pe_client *c, pe_client_status *out); /* out: required */

/* Shared memory: the caller creates a POSIX region (shm_open name "/pe-..."),
 * the daemon maps it; feeds then point into it with shm_region/shm_offset.
 * region (out): required. A region belongs to the handle that registered
 * it: another handle's requests naming its id get PE_C_ENOTFOUND.
 *
 * Proof of ownership: the daemon opens the name with its own rights, so
 * the object must hold, right after its `size` bytes of data, a trailer of
 * PE_CLIENT_SHM_TRAILER bytes with a random token, which
 * pe_client_register_shm reads and sends; the daemon registers the region
 * only when the token matches (else PE_C_ENOTFOUND, as for a name that does
 * not exist). pe_client_shm_seal(fd, size) writes one to an object of your
 * own: it grows the object to size + PE_CLIENT_SHM_TRAILER (the data is
 * untouched) and writes a fresh token there; 0 or -errno.
 * pe_client_register_shm on an object it can read without a trailer:
 * PE_C_EARG. */
#define PE_CLIENT_SHM_TRAILER 64
int pe_client_shm_seal(int fd, size_t size);
int pe_client_register_shm(pe_client *c, const char *name, uint64_t size, uint64_t *region);
int pe_client_unregister_shm(pe_client *c, uint64_t region);

/* A region made and registered in one call: shm_open (a unique name, mode
 * 0600), ftruncate, the trailer (pe_client_shm_seal), mmap of `size`
 * bytes, RegisterShm. When the daemon runs as another user
 * (the owner of its ipc:// socket file, e.g. the service's pe-executord),
 * one POSIX ACL entry gives that user, and no one else, read access; a file
 * system without ACLs is then an error (PE_C_EIO) that says so. The name
 * stays until pe_client_shm_close, since the daemon opens it by name. */
typedef struct pe_client_shm {
  uint64_t region;
  void *base;
  size_t size;
  char name[64];
} pe_client_shm;
int pe_client_shm_create(pe_client *c, size_t size, pe_client_shm *out); /* out: required */
/* Unregister (when c is not NULL), unmap and unlink; shm may be NULL. */
void pe_client_shm_close(pe_client *c, pe_client_shm *shm);

/* Regions left behind by a process that did not get to close them. Names
 * carry the creator's pid and start time and a random part
 * ("/pe-<pid>-<start>-<random>"; nothing of the client: /dev/shm lists
 * them to everyone).
 * pe_client_shm_unlink_all unlinks every region this process created and
 * has not closed; async-signal-safe (the mappings stay valid until exit).
 * pe_client_shm_unlink_on_signals installs a handler for SIGINT, SIGTERM,
 * SIGHUP and SIGQUIT that does that, then dies of the signal (only where
 * the action is still the default: a program's own handler and an ignored
 * signal are kept). pe_client_shm_sweep unlinks this user's regions whose
 * creator has exited (SIGKILL, a crash) and returns how many;
 * pe_client_shm_create runs it first. The daemon also unlinks such a
 * region when the session that registered it ends, where it may (it runs
 * as the region's user or as root). */
void pe_client_shm_unlink_all(void);
void pe_client_shm_unlink_on_signals(void);
int pe_client_shm_sweep(void);

#ifdef __cplusplus
}
#endif

#endif
