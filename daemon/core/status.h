/* Status values: every call that can fail returns a pe_status pointer.
 * NULL means success. A failure is a heap object carrying a code and a message;
 * the caller owns it and frees it with pe_status_free (or hands it upward).
 * Messages name the op, the variable and the shape where there is one. */
#ifndef PE_CORE_STATUS_H
#define PE_CORE_STATUS_H

#include <stdarg.h>

typedef enum pe_code {
  PE_OK = 0,
  PE_EINVAL,          /* bad argument or malformed input */
  PE_ENOMEM,          /* allocation failed */
  PE_ENOTFOUND,       /* named thing does not exist */
  PE_EUNKNOWN_OP,     /* op type not in the registry */
  PE_EUNKNOWN_VAR,    /* variable not declared in the block */
  PE_EATTR,           /* attribute missing or of the wrong type */
  PE_EARITY,          /* wrong number of arguments in a slot */
  PE_ESHAPE,          /* shape mismatch */
  PE_EDTYPE,          /* dtype mismatch */
  PE_EUSE_BEFORE_DEF, /* variable read before any op writes it */
  PE_ECYCLE,          /* dependency cycle */
  PE_EMISSING_FEED,   /* a feed variable was not supplied */
  PE_EIO,             /* file or socket error */
  PE_ECORRUPT,        /* data failed an integrity check */
  PE_ENOGRAD,         /* gradient requested where none exists */
  PE_EBACKEND,        /* oneDNN / CUDA / NCCL reported an error */
  PE_EINTERNAL,       /* broken invariant inside the runtime */
  PE_EALREADY,        /* a resent request whose run already reached the model */
  PE_EPERM,           /* the client may not do this to another client's thing */
  PE_EEXHAUSTED,      /* a daemon limit is reached (config [limits]); retry later */
  PE_EDEADLINE,       /* the request's own time limit ran out (RunOptions.timeout_ms) */
  PE_ESHUTDOWN,       /* the daemon is stopping (SIGTERM/SIGINT): the request was not done */
  PE_ECODE_COUNT
} pe_code;

typedef struct pe_status {
  pe_code code;
  char msg[];
} pe_status;

/* Make a failure. Never returns NULL: on allocation failure a static
 * out-of-memory status is returned (pe_status_free knows not to free it). */
pe_status *pe_error(pe_code code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
pe_status *pe_verror(pe_code code, const char *fmt, va_list ap);

/* Prefix an existing failure's message ("while X: <old>"). Consumes st. */
pe_status *pe_status_wrap(pe_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void pe_status_free(pe_status *st);
const char *pe_code_name(pe_code code);
static inline pe_code pe_status_code(const pe_status *st) { return st ? st->code : PE_OK; }
static inline const char *pe_status_msg(const pe_status *st) { return st ? st->msg : "ok"; }

/* Propagate a failure to the caller. */
#define PE_TRY(expr)                   \
  do {                                 \
    pe_status *pe_try_st_ = (expr);    \
    if (pe_try_st_) return pe_try_st_; \
  } while (0)

#endif
