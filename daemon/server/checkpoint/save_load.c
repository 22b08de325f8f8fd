/* Checkpoints of a model (see checkpoint/save_load.h). */
#include "server/checkpoint/save_load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/finite.h"
#include "core/log.h"
#include "core/strmap.h"

/* Checkpoints larger than this are refused on load (a corrupt or foreign
 * file must not make the daemon allocate without bound). */
#define PE_CKPT_MAX_BYTES ((size_t)64 << 30)

pe_status *pe_checkpoint_path(const char *state_dir, const char *model, const char *name, char *dir,
                              size_t dir_len, char *file, size_t file_len) {
  PE_TRY(pe_name_check("model name", model));
  PE_TRY(pe_name_check("checkpoint name", name));
  int a = snprintf(dir, dir_len, "%s/models/%s", state_dir, model);
  int b = snprintf(file, file_len, "%s.ckpt", name);
  if (a < 0 || b < 0 || (size_t)a >= dir_len || (size_t)b >= file_len)
    return pe_error(PE_EINVAL, "checkpoint '%s' of model '%s': path too long under %s", name, model,
                    state_dir);
  return NULL;
}

/* What a save must not write over the file dir/file: no
 * tensor at all (a model registered but never trained, loaded or restored:
 * an empty file would replace a good one), or a non-finite value (a
 * diverged model: its NaNs would replace the last good checkpoint, the
 * restart checkpoint included). The error names the model, the first such
 * variable and the file, which is left as it is. */
static pe_status *check_saveable(const pe_srv_model *m, const pe_ckpt_entry *e, int n,
                                 const char *dir, const char *file) {
  if (!n)
    return pe_error(PE_EINVAL,
                    "model '%s' has no values (not trained, loaded or restored since the daemon "
                    "started): nothing to save; %s/%s left as it is",
                    m->name, dir, file);
  for (int i = 0; i < n; i++) {
    int64_t first;
    int64_t bad = pe_tensor_nonfinite(&e[i].t, &first);
    if (!bad) continue;
    char shape[PE_SHAPE_STRLEN];
    PE_LOGW(
        "model '%s': persistable '%s' has %lld non-finite value(s): not saved, %s/%s left as it is",
        m->name, e[i].name, (long long)bad, dir, file);
    return pe_error(PE_EINVAL,
                    "model '%s': persistable '%s' %s has %lld non-finite value(s) of %lld (the "
                    "first, at flat index %lld, is %s): the model has diverged or was given "
                    "non-finite values; not saved, %s/%s left as it is (load a good checkpoint "
                    "into the model, or drop-model to start afresh)",
                    m->name, e[i].name, pe_shape_str(&e[i].t.shape, shape, sizeof shape),
                    (long long)bad, (long long)pe_shape_numel(&e[i].t.shape), (long long)first,
                    pe_tensor_nonfinite_str(&e[i].t, first), dir, file);
  }
  return NULL;
}

static pe_status *save_as(const char *state_dir, pe_srv_model *m, const char *name, char **path,
                          uint64_t *bytes) {
  char dir[4096], file[128];
  PE_TRY(pe_checkpoint_path(state_dir, m->name, name, dir, sizeof dir, file, sizeof file));
  const char **names = NULL;
  int n = 0;
  pe_status *st = pe_model_names(m->m, &names, &n);
  if (st) {
    st = pe_status_wrap(st, "save '%s' of model '%s'", name, m->name);
    pe_srv_model_note_save(m, name, 0, st);
    return st;
  }
  /* One snapshot of every persistable (pe_model_get_many): the file holds
   * one step boundary even while other clients' runs go on. */
  pe_ckpt_entry *e = calloc(n ? (size_t)n : 1, sizeof *e);
  pe_tensor *t = calloc(n ? (size_t)n : 1, sizeof *t);
  bool *has = calloc(n ? (size_t)n : 1, sizeof *has);
  st = e && t && has ? NULL : pe_error(PE_ENOMEM, "save '%s': out of memory", name);
  pe_model_mark mark = {0}; /* which requests' runs the values include, the generator */
  if (!st) st = pe_model_get_many(m->m, names, n, t, has, &mark);
  int kept = 0, skipped = 0;
  for (int i = 0; i < n && !st; i++) {
    if (!has[i]) { /* declared by a program but never given a value */
      skipped++;
      continue;
    }
    e[kept].t = t[i];
    memset(&t[i], 0, sizeof t[i]); /* moved */
    e[kept].name = strdup(names[i]);
    kept++;
    if (!e[kept - 1].name) st = pe_error(PE_ENOMEM, "save '%s': out of memory", name);
  }
  for (int i = 0; t && i < n; i++) pe_tensor_release(&t[i]);
  free(t);
  free(has);
  free(names);
  if (skipped)
    PE_LOGD("model '%s': save '%s' skips %d persistables without a value", m->name, name, skipped);
  n = kept;
  if (!st) st = check_saveable(m, e, n, dir, file);
  uint8_t *buf = NULL;
  size_t len = 0;
  if (!st) st = pe_ckpt_encode(e, n, &mark, &buf, &len);
  uint64_t version = mark.version;
  pe_model_mark_release(&mark);
  pe_ckpt_entries_free(e, n);
  /* save_mu: a drop of the model removes the restart checkpoint between
   * two writes, never before one that then puts it back. */
  pthread_mutex_lock(&m->save_mu);
  if (!st && m->saves_closed) st = pe_error(PE_EINVAL, "the model has been dropped");
  if (!st) st = pe_mkdir_p(dir, 0750);
  if (!st) st = pe_write_atomic(dir, file, buf, len);
  pthread_mutex_unlock(&m->save_mu);
  free(buf);
  if (st) st = pe_status_wrap(st, "save '%s' of model '%s'", name, m->name);
  pe_srv_model_note_save(m, name, version, st);
  if (st) return st;
  char full[4300];
  snprintf(full, sizeof full, "%s/%s", dir, file);
  *path = strdup(full);
  *bytes = len;
  PE_LOGI("model '%s': saved %d tensors, %zu bytes to %s", m->name, n, len, full);
  return NULL;
}

pe_status *pe_checkpoint_save(const char *state_dir, pe_srv_model *m, const char *name, char **path,
                              uint64_t *bytes) {
  if (!strcmp(name, m->restart_name))
    return pe_error(PE_EINVAL,
                    "save '%s' of model '%s': '%s' is the restart checkpoint's name (config "
                    "shutdown_checkpoint): the daemon overwrites it at shutdown and autosave, and "
                    "drop-model removes it; choose another name",
                    name, m->name, name);
  return save_as(state_dir, m, name, path, bytes);
}

pe_status *pe_checkpoint_save_restart(const char *state_dir, pe_srv_model *m, char **path,
                                      uint64_t *bytes) {
  return save_as(state_dir, m, m->restart_name, path, bytes);
}

/* Entries that do not fit the program's declarations decl (n_decl; may be
 * 0): "'fc_0.w' has shape [784,256], the program declares [784,512]". */
static pe_status *check_decls(const pe_ckpt_entry *e, int n, const pe_var_info *decl, int n_decl) {
  char why[2 * PE_SHAPE_STRLEN + 256];
  /* name -> its declaration: a model of many variables loads in time
   * linear in them, not their square. */
  pe_strmap index;
  pe_strmap_init(&index);
  pe_status *st = NULL;
  for (int j = 0; j < n_decl && !st; j++)
    if (!pe_strmap_put(&index, decl[j].name, (void *)&decl[j]))
      st = pe_error(PE_ENOMEM, "out of memory indexing %d declarations", n_decl);
  for (int i = 0; i < n && !st; i++) {
    const pe_var_info *d = pe_strmap_get(&index, e[i].name);
    if (!d) continue;
    pe_var_info have = {e[i].name, e[i].t.dtype, e[i].t.shape};
    pe_code code = pe_var_misfit(&have, d, PE_FIT_DECL, why, sizeof why);
    if (code != PE_OK) st = pe_error(code, "%s", why);
  }
  pe_strmap_destroy(&index);
  return st;
}

/* Read and check the whole file at full (size, magic and version, CRC,
 * bounds): its entries and mark, nothing set anywhere. */
static pe_status *read_checked(const char *full, pe_ckpt_entry **e, int *n, pe_model_mark *mark,
                               size_t *len) {
  uint8_t *buf;
  PE_TRY(pe_read_file(full, PE_CKPT_MAX_BYTES, &buf, len));
  pe_status *st = pe_ckpt_decode(buf, *len, full, e, n, mark);
  free(buf);
  return st;
}

/* Load checkpoint `name` into m, every value checked first (against decl,
 * then the model's claims), so that a misfit changes nothing. known: a
 * Load, which needs a tensor the model knows (registry/model_shapes.h: a file none
 * of whose tensors a program of the model declares is of another
 * architecture); a restore (the model's own file, before its first
 * program's declarations) does not. Tensors beyond the model's variables
 * are loaded: a training program's optimizer state into a model that has
 * only its eval program now. Errors are not prefixed; full gets the file's
 * path; *unread: the error is the file's (read_checked), nothing was tried
 * on the model. */
static pe_status *load_checked(const char *state_dir, pe_srv_model *m, const char *name,
                               const pe_var_info *decl, int n_decl, bool known, char *full,
                               size_t full_len, uint64_t *bytes, bool *unread) {
  *unread = false;
  char dir[4096], file[128];
  PE_TRY(pe_checkpoint_path(state_dir, m->name, name, dir, sizeof dir, file, sizeof file));
  snprintf(full, full_len, "%s/%s", dir, file);
  size_t len;
  pe_ckpt_entry *e;
  int n;
  pe_model_mark restore = {0};
  pe_status *st = read_checked(full, &e, &n, &restore, &len);
  if (st) {
    *unread = true;
    return st;
  }
  /* An empty file (a save of a model without values, before saves refused
   * it) would "load" and change nothing: the user would think the model
   * holds the checkpoint's values. */
  if (known && n == 0) {
    pe_ckpt_entries_free(e, n);
    pe_model_mark_release(&restore);
    return pe_error(PE_EINVAL,
                    "checkpoint %s holds no tensors (a save of a model that had no values): "
                    "nothing to load; model '%s' is unchanged",
                    full, m->name);
  }
  const char **names = malloc((n ? (size_t)n : 1) * sizeof *names);
  pe_tensor *vals = malloc((n ? (size_t)n : 1) * sizeof *vals);
  if (!names || !vals) st = pe_error(PE_ENOMEM, "out of memory");
  for (int i = 0; i < n && !st; i++) {
    names[i] = e[i].name;
    vals[i] = e[i].t;
  }
  /* All or nothing: a checkpoint of another architecture changes nothing. */
  if (!st) st = check_decls(e, n, decl, n_decl);
  if (!st && known) st = pe_shape_claims_known(&m->shapes, m->name, names, n, true);
  if (!st) st = pe_srv_model_claim_values(m, names, vals, n);
  /* One engine op: no run sees part of the checkpoint. The model's run
   * origins become the file's: a resend of a request the values include is
   * refused (server/run/request.c), one after them runs. So does its generator
   * offset: the runs after it draw the dropout masks the runs after the
   * save drew. */
  if (!st) st = pe_model_set_many(m->m, names, vals, n, &restore);
  pe_model_mark_release(&restore);
  if (!st) pe_model_mark_initialized(m, names, n);
  free(names);
  free(vals);
  pe_ckpt_entries_free(e, n);
  if (!st) {
    *bytes = len;
    PE_LOGI("model '%s': loaded %d tensors from %s", m->name, n, full);
    if (!strcmp(name, m->restart_name)) {
      /* The values are the restart checkpoint's (a restore, or a Load of
       * it): a register never reads it again, and status counts from here. */
      pthread_mutex_lock(&m->init_mu);
      m->restart_seen = true;
      pthread_mutex_unlock(&m->init_mu);
      pe_srv_model_note_restart_read(m, pe_model_changes(m->m));
    }
  }
  return st;
}

pe_status *pe_checkpoint_load(const char *state_dir, pe_srv_model *m, const char *name, char **path,
                              uint64_t *bytes) {
  char full[4300];
  bool unread;
  PE_TRY(pe_status_wrap(
      load_checked(state_dir, m, name, NULL, 0, true, full, sizeof full, bytes, &unread),
      "load '%s' of model '%s'", name, m->name));
  *path = strdup(full);
  return NULL;
}

/* The register's refusal for a restart checkpoint at full that cannot be
 * read, or (unread false) was read and could not be set (why: the error,
 * its "checkpoint <full>: " left out). */
static pe_status *unrestored(const pe_srv_model *m, const char *full, const pe_status *why,
                             bool unread) {
  const char *msg = pe_status_msg(why);
  size_t fl = strlen(full);
  if (!strncmp(msg, "checkpoint ", 11) && !strncmp(msg + 11, full, fl) && msg[11 + fl] == ':')
    msg += 11 + fl + 1 + (msg[12 + fl] == ' ');
  const char *what = unread ? "cannot be read" : "could not be restored";
  PE_LOGW("model '%s': restart checkpoint %s %s, register refused: %s", m->name, full, what, msg);
  return pe_error(pe_status_code(why),
                  "register: model '%s': its restart checkpoint %s %s: %s; the file is kept and "
                  "nothing replaces it while it is there: repair it or move it away and register "
                  "again, register the program under another model name, or discard the file "
                  "(pe-client drop-model --model %s)",
                  m->name, full, what, msg, m->name);
}

pe_status *pe_checkpoint_restore(const char *state_dir, const char *name, pe_srv_model *m,
                                 const pe_var_info *decl, int n_decl) {
  char dir[4096], file[128], full[4300];
  if (!pe_name_valid(name)) return NULL;
  pe_status *st = pe_checkpoint_path(state_dir, m->name, name, dir, sizeof dir, file, sizeof file);
  if (st) {
    pe_status_free(st);
    return NULL;
  }
  snprintf(full, sizeof full, "%s/%s", dir, file);
  pe_status *refused = NULL;
  pthread_mutex_lock(&m->init_mu);
  struct stat sb;
  bool has_values = m->initialized.len > 0;
  if (has_values && m->restart_seen) {
    /* Restored, checked or written by this model already. */
  } else if (stat(full, &sb) != 0) {
    if (errno != ENOENT) {
      st = pe_error(PE_EIO, "stat: %s", strerror(errno));
      refused = unrestored(m, full, st, true);
    }
  } else if (has_values) {
    /* Values that did not come from the file (a SetParams or Load between
     * the model's creation and its first register's restore): neither
     * restored over nor allowed to replace the file. */
    refused = pe_error(PE_EINVAL,
                       "register: model '%s' has values that did not come from its restart "
                       "checkpoint %s (set before a register restored it); the file is kept: "
                       "load it (pe-client load --model %s --checkpoint %s), or discard it "
                       "(pe-client drop-model --model %s)",
                       m->name, full, m->name, name, m->name);
    PE_LOGW("model '%s': restart checkpoint %s not restored over values set before: %s", m->name,
            full, pe_status_msg(refused));
  } else {
    uint64_t bytes = 0;
    bool unread;
    st = load_checked(state_dir, m, name, decl, n_decl, false, full, sizeof full, &bytes, &unread);
    pe_code code = pe_status_code(st);
    if (code == PE_ESHAPE || code == PE_EDTYPE) {
      refused = pe_error(code,
                         "register: model '%s': its restart checkpoint %s does not fit the "
                         "program: %s; the file is kept: register the program under another "
                         "model name, or drop the model to discard the checkpoint (pe-client "
                         "drop-model --model %s)",
                         m->name, full, pe_status_msg(st), m->name);
      PE_LOGW("model '%s': restart checkpoint %s not restored: %s", m->name, full,
              pe_status_msg(st));
    } else if (st) {
      refused = unrestored(m, full, st, unread);
    } else {
      PE_LOGI("model '%s': restored from its restart checkpoint %s", m->name, full);
    }
  }
  pe_status_free(st);
  if (!refused) m->restart_seen = true;
  pthread_mutex_unlock(&m->init_mu);
  return refused;
}
