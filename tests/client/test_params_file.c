/* pe_params_file.h: tensors written to the daemon's checkpoint format read
 * back equal (names in order, dtypes, shapes, bytes); the file decodes with
 * the daemon's own reader; bad tensors are refused naming the tensor and
 * the file; a corrupted or missing file is refused naming the file. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "format/checkpoint_format.h"
#include "format/durable_file.h"
#include "pe_params_file.h"
#include "test_assert.h"

typedef struct dir {
  char path[64], file[96];
} dir;

static void dir_make(dir *d) {
  snprintf(d->path, sizeof d->path, "/tmp/pe_params_file.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(d->path));
  snprintf(d->file, sizeof d->file, "%s/w.pe", d->path);
}

static void dir_remove(dir *d) {
  unlink(d->file);
  rmdir(d->path);
}

static const float W[6] = {1.5f, -2, 3, 0.25f, 5, -6};
static const int64_t STEP[1] = {42};

/* "fc.w" f32 [2,3], "step" i64 [1], "scalar" u8 [] (no dims). */
static void three(pe_client_tensor t[3]) {
  static const uint8_t u = 7;
  pe_client_tensor_set(&t[0], "step", PE_B_I64, 1, (const int64_t[]){1}, STEP);
  pe_client_tensor_set(&t[1], "fc.w", PE_B_F32, 2, (const int64_t[]){2, 3}, W);
  pe_client_tensor_set(&t[2], "scalar", PE_B_U8, 0, NULL, &u);
}

START_TEST(written_tensors_read_back_equal) {
  dir d;
  dir_make(&d);
  pe_client_tensor t[3];
  three(t);
  uint64_t bytes = 0;
  char err[512];
  ck_assert_msg(pe_params_file_write(t, 3, d.file, &bytes, err, sizeof err) == 0, "%s", err);
  struct stat st;
  ck_assert_int_eq(stat(d.file, &st), 0);
  ck_assert_uint_eq(bytes, (uint64_t)st.st_size);
  pe_params_file p;
  ck_assert_msg(pe_params_file_read(d.file, &p, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(p.n, 3);
  /* name order */
  ck_assert_str_eq(p.t[0].name, "fc.w");
  ck_assert_str_eq(p.t[1].name, "scalar");
  ck_assert_str_eq(p.t[2].name, "step");
  ck_assert_int_eq(p.t[0].dtype, PE_B_F32);
  ck_assert_int_eq(p.t[0].ndim, 2);
  ck_assert_int_eq(p.t[0].shape[0], 2);
  ck_assert_int_eq(p.t[0].shape[1], 3);
  ck_assert_uint_eq(p.t[0].nbytes, sizeof W);
  ck_assert_int_eq(memcmp(p.t[0].data, W, sizeof W), 0);
  ck_assert_int_eq(p.t[1].ndim, 0);
  ck_assert_int_eq(*(const uint8_t *)p.t[1].data, 7);
  ck_assert_int_eq(*(const int64_t *)p.t[2].data, 42);
  pe_params_file_free(&p);
  pe_params_file_free(&p); /* zeroed: nothing */
  pe_params_file_free(NULL);
  /* the daemon's reader takes the file as it is */
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_read_file(d.file, 1 << 20, &buf, &len));
  ck_assert_uint_eq(len, bytes);
  pe_ckpt_entry *e;
  int n;
  PE_CK_OK(pe_ckpt_decode(buf, len, d.file, &e, &n, NULL));
  ck_assert_int_eq(n, 3);
  pe_ckpt_entries_free(e, n);
  free(buf);
  /* an empty set is a file too */
  ck_assert_msg(pe_params_file_write(NULL, 0, d.file, NULL, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(pe_params_file_read(d.file, &p, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(p.n, 0);
  pe_params_file_free(&p);
  dir_remove(&d);
}
END_TEST

static void expect_write_refused(pe_client_tensor *t, size_t n, const char *path,
                                 const char *want) {
  char err[512] = "";
  ck_assert_int_eq(pe_params_file_write(t, n, path, NULL, err, sizeof err), -1);
  ck_assert_msg(strstr(err, want), "'%s' does not say '%s'", err, want);
  ck_assert_int_eq(access(path, F_OK), -1); /* nothing written */
}

START_TEST(bad_tensors_are_refused_naming_them) {
  dir d;
  dir_make(&d);
  pe_client_tensor t[3];
  three(t);
  t[1].nbytes = 20;
  expect_write_refused(t, 3, d.file, "tensor 'fc.w' f32 [2,3] needs 24 bytes, got 20");
  three(t);
  t[2].name = "step";
  expect_write_refused(t, 3, d.file, "tensor 'step' given twice");
  three(t);
  t[0].dtype = (pe_b_dtype)9;
  expect_write_refused(t, 3, d.file, "tensor 'step': unknown dtype 9");
  three(t);
  t[1].shape[1] = -3;
  expect_write_refused(t, 3, d.file, "negative dim 1");
  three(t);
  t[0].name = NULL;
  expect_write_refused(t, 3, d.file, "a tensor without a name");
  three(t);
  t[1].data = NULL;
  expect_write_refused(t, 3, d.file, "tensor 'fc.w' [2,3]: no data");
  expect_write_refused(NULL, 2, d.file, "2 tensors but no array");
  three(t);
  char err[512];
  ck_assert_int_eq(pe_params_file_write(t, 3, "/nonexistent/dir/x.pe", NULL, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "/nonexistent/dir"), "%s", err);
  dir_remove(&d);
}
END_TEST

START_TEST(a_damaged_or_missing_file_is_refused_naming_it) {
  dir d;
  dir_make(&d);
  pe_client_tensor t[3];
  three(t);
  uint64_t bytes;
  char err[512];
  ck_assert_msg(pe_params_file_write(t, 3, d.file, &bytes, err, sizeof err) == 0, "%s", err);
  FILE *f = fopen(d.file, "r+b");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fseek(f, (long)bytes / 2, SEEK_SET), 0);
  int c = fgetc(f);
  ck_assert_int_eq(fseek(f, (long)bytes / 2, SEEK_SET), 0);
  fputc(c ^ 0x10, f);
  fclose(f);
  pe_params_file p;
  ck_assert_int_eq(pe_params_file_read(d.file, &p, err, sizeof err), -1);
  ck_assert_msg(strstr(err, d.file) && strstr(err, "CRC"), "%s", err);
  ck_assert_ptr_null(p.t);
  ck_assert_int_eq(truncate(d.file, 5), 0);
  ck_assert_int_eq(pe_params_file_read(d.file, &p, err, sizeof err), -1);
  ck_assert_msg(strstr(err, d.file), "%s", err);
  unlink(d.file);
  ck_assert_int_eq(pe_params_file_read(d.file, &p, err, sizeof err), -1);
  ck_assert_msg(strstr(err, d.file), "%s", err);
  ck_assert_int_eq(pe_params_file_read("", &p, err, sizeof err), -1);
  dir_remove(&d);
}
END_TEST

static Suite *params_file_suite(void) {
  Suite *s = suite_create("params_file");
  TCase *tc = tcase_create("params_file");
  tcase_add_test(tc, written_tensors_read_back_equal);
  tcase_add_test(tc, bad_tensors_are_refused_naming_them);
  tcase_add_test(tc, a_damaged_or_missing_file_is_refused_naming_it);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(params_file_suite)
