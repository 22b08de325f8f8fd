/* Model files from the file system (pe_model_file.h): read one (at most
 * 1 MiB) and parse it with pe_model_file_parse (model_file.c), and resolve
 * a trainer's --model: a path, a built-in name, or a file of the installed
 * models directory. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_internal.h"
#include "pe_model_file.h"

int pec_model_file_load(const char *path, const pe_model_opts *o, pe_model_spec *out, char *err,
                        size_t errlen) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { /* fopen takes one; the read fails */
    snprintf(err, errlen, "%s: is a directory, not a model file", path);
    fclose(f);
    return -1;
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 4096;
      if (cap > (1u << 20)) {
        snprintf(err, errlen, "%s: larger than 1 MiB: not a model file", path);
        free(buf);
        fclose(f);
        return -1;
      }
      char *nb = realloc(buf, cap);
      if (!nb) {
        snprintf(err, errlen, "%s: out of memory", path);
        free(buf);
        fclose(f);
        return -1;
      }
      buf = nb;
    }
    size_t n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    snprintf(err, errlen, "%s: read error", path);
    free(buf);
    return -1;
  }
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  int rc = pec_model_file_parse(buf, len, base, o, out, err, errlen);
  free(buf);
  return rc;
}

int pe_model_file_load(const char *path, pe_model_spec *out, char *err, size_t errlen) {
  return pec_model_file_load(path, NULL, out, err, errlen);
}

static int resolve(const char *spec, const char *models_dir, const pe_model_opts *o,
                   pe_model_spec *out, char *err, size_t errlen) {
  struct stat st;
  if (strchr(spec, '/') || (stat(spec, &st) == 0 && S_ISREG(st.st_mode)))
    return pec_model_file_load(spec, o, out, err, errlen);
  if (!pec_model_spec_build(spec, o, out, err, errlen)) return 0;
  if (pec_model_builtin(spec)) return -1; /* its options failed: no file stands in */
  char path[4096];
  if (models_dir && *models_dir &&
      snprintf(path, sizeof path, "%s/%s", models_dir, spec) < (int)sizeof path &&
      stat(path, &st) == 0 && S_ISREG(st.st_mode))
    return pec_model_file_load(path, o, out, err, errlen);
  size_t n = strlen(err);
  if (models_dir && *models_dir)
    snprintf(err + n, errlen - n, " (or give a model file path, or the name of a file in %s)",
             models_dir);
  else
    snprintf(err + n, errlen - n, " (or give a model file path)");
  return -1;
}

int pe_model_resolve_in(const char *spec, const char *models_dir, pe_model_spec *out, char *err,
                        size_t errlen) {
  return resolve(spec, models_dir, NULL, out, err, errlen);
}

/* The directory `cmake --install` puts conf/models in (CMakeLists.txt). */
#ifndef PE_MODELS_DIR
#define PE_MODELS_DIR ""
#endif

int pe_model_resolve(const char *spec, pe_model_spec *out, char *err, size_t errlen) {
  return resolve(spec, PE_MODELS_DIR, NULL, out, err, errlen);
}

int pe_model_resolve_opts(const char *spec, const pe_model_opts *o, pe_model_spec *out, char *err,
                          size_t errlen) {
  return resolve(spec, PE_MODELS_DIR, o, out, err, errlen);
}
