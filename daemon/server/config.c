/* Config layers: defaults -> INI file -> command line (see config.h). */
#include "server/config.h"

#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/strmap.h"

typedef struct ini_ctx {
  pe_srv_config *c;
  pe_status *err; /* first error */
  const char *what;
  pe_strmap seen; /* "section\nkey" of the keys set so far (values unused) */
  /* Input, read by read_counting: a file, or else a string. */
  FILE *f;
  const char *text;
  int line; /* the line the handler is called for (1-based) */
} ini_ctx;

/* inih's reader, counting lines as inih does (one per read; the system
 * inih is built without INI_HANDLER_LINENO, and a warning names the line). */
static char *read_counting(char *buf, int n, void *stream) {
  ini_ctx *x = stream;
  if (x->f) {
    if (!fgets(buf, n, x->f)) return NULL;
  } else {
    if (!*x->text) return NULL;
    size_t k = strcspn(x->text, "\n");
    if (x->text[k] == '\n') k++; /* with its newline, as fgets */
    if (k > (size_t)n - 1) k = (size_t)n - 1;
    memcpy(buf, x->text, k);
    buf[k] = 0;
    x->text += k;
  }
  x->line++;
  return buf;
}

/* inih goes on past a bad line (its build has INI_STOP_ON_FIRST_ERROR 0)
 * and returns the first bad line's number, so a header missing its ']'
 * shows up here as the keys after it having no section, reported at the
 * header's line. A key given twice is refused: the second value would
 * silently win over the one a reader of the file sees first. */
static int cfg_ini_handler(void *user, const char *section, const char *name, const char *value) {
  ini_ctx *x = user;
  if (x->err) return 1;
  if (!section || !*section) {
    x->err = pe_error(PE_EINVAL,
                      "key '%.64s' comes before any valid [section] header (each header needs "
                      "its closing ']')",
                      name);
    return 0;
  }
  char id[160];
  snprintf(id, sizeof id, "%.64s\n%.64s", section, name);
  if (pe_strmap_has(&x->seen, id)) {
    x->err = pe_error(PE_EINVAL, "config [%.64s] %.64s is set twice", section, name);
    return 0;
  }
  if (!pe_strmap_put(&x->seen, id, NULL)) {
    x->err = pe_error(PE_ENOMEM, "config: out of memory");
    return 0;
  }
  x->err = pe_config_set(x->c, section, name, value ? value : "");
  const pe_config_key *k = x->err ? NULL : pe_config_key_find(section, name);
  const char *warning = k && k->warn ? k->warn(x->c) : NULL;
  if (warning) PE_LOGW("%s:%d: [%s] %s = %s %s", x->what, x->line, section, name, value, warning);
  return x->err ? 0 : 1; /* 0: inih reports this line as the first error */
}

static pe_status *finish(ini_ctx *x, int rc) {
  pe_strmap_destroy(&x->seen);
  if (rc < 0) { /* inih's line buffer */
    pe_status_free(x->err);
    return pe_error(PE_ENOMEM, "%s: out of memory reading it", x->what);
  }
  if (x->err) return pe_status_wrap(x->err, "%s: line %d", x->what, rc);
  if (rc > 0)
    return pe_error(PE_EINVAL, "%s: line %d: syntax error (expected [section] or key = value)",
                    x->what, rc);
  return NULL;
}

pe_status *pe_config_load_file(pe_srv_config *c, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return pe_error(PE_EIO, "%s: cannot open: %s", path, strerror(errno));
  ini_ctx x = {.c = c, .what = path, .f = f};
  pe_strmap_init(&x.seen);
  int rc = ini_parse_stream(read_counting, &x, cfg_ini_handler, &x);
  fclose(f);
  return finish(&x, rc);
}

pe_status *pe_config_load_string(pe_srv_config *c, const char *text, const char *what) {
  ini_ctx x = {.c = c, .what = what, .text = text};
  pe_strmap_init(&x.seen);
  int rc = ini_parse_stream(read_counting, &x, cfg_ini_handler, &x);
  return finish(&x, rc);
}

pe_status *pe_config_build(pe_srv_config *c, const char *path, const pe_config_override *ov,
                           int n_ov) {
  pe_status *st = pe_config_defaults(c);
  if (st) return st; /* c freed */
  if (path) st = pe_config_load_file(c, path);
  for (int i = 0; !st && i < n_ov; i++)
    st = pe_status_wrap(pe_config_set(c, ov[i].section, ov[i].key, ov[i].value), "command line");
  if (!st) st = pe_config_check(c);
  if (st) pe_config_free(c);
  return st;
}
