/* Checkpoint names, format round trip (bitwise), corruption detection and
 * atomic writes. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

START_TEST(test_names) {
  const char *good[] = {
      "a",       "ckpt-1", "epoch_10.final",
      "A.b-c_d", "x..y",   "0123456789012345678901234567890123456789012345678901234567890123"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    ck_assert_msg(pe_name_valid(good[i]), "'%s' should be valid", good[i]);
  const char *bad[] = {
      "",     ".",           "..",
      "../x", ".hidden",     "a/b",
      "/abs", "a b",         "a\\b",
      "x\n",  "caf\xc3\xa9", "01234567890123456789012345678901234567890123456789012345678901234"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    ck_assert_msg(!pe_name_valid(bad[i]), "'%s' should be invalid", bad[i]);
  ck_assert(!pe_name_valid(NULL));
  expect_errors(pe_name_check("checkpoint name", "../etc"), PE_EINVAL, "checkpoint name",
                "'../etc'", (const char *)NULL);
  expect_errors(pe_name_check("checkpoint name", "a/b"), PE_EINVAL, "'a/b'", "[A-Za-z0-9._-]",
                (const char *)NULL);
  expect_error(pe_name_check("model name", ""), PE_EINVAL, "model name is empty");
  ck_assert_ptr_null(pe_name_check("model name", "mlp"));
}
END_TEST

static void make_entries(pe_ckpt_entry **out, int *n) {
  pe_ckpt_entry *e = calloc(3, sizeof *e);
  e[0].name = strdup("w");
  pe_shape s0 = PE_SHAPE(3, 4);
  PE_CK_OK(pe_tensor_resize(&e[0].t, PE_F32, &s0, "w"));
  for (int i = 0; i < 12; i++) pe_f32(&e[0].t)[i] = (float)i * 0.25f - 1.0f;
  pe_f32(&e[0].t)[5] = -0.0f; /* bitwise, signed zero included */
  e[1].name = strdup("a_step");
  pe_shape s1 = PE_SHAPE(1);
  PE_CK_OK(pe_tensor_resize(&e[1].t, PE_I64, &s1, "a_step"));
  pe_i64(&e[1].t)[0] = 123456789012345LL;
  e[2].name = strdup("empty");
  pe_shape s2 = PE_SHAPE(0, 7);
  PE_CK_OK(pe_tensor_resize(&e[2].t, PE_F64, &s2, "empty"));
  *out = e;
  *n = 3;
}

START_TEST(test_round_trip) {
  pe_ckpt_entry *e;
  int n;
  make_entries(&e, &n);
  uint8_t *buf;
  size_t len;
  pe_run_origin orig[2] = {{0x1234567890abcdefull, 41, 16}, {7, 1, 1}};
  const pe_model_mark mark = {
      .origins = orig, .n_origins = 2, .has_rng = true, .rng_offset = 0xfedcba9876543210ull};
  PE_CK_OK(pe_ckpt_encode(e, n, &mark, &buf, &len));
  pe_ckpt_entry *d;
  int nd;
  pe_model_mark got;
  PE_CK_OK(pe_ckpt_decode(buf, len, "mem", &d, &nd, &got));
  ck_assert_int_eq(got.n_origins, 2);
  for (int i = 0; i < 2; i++) /* field by field: the struct has padding */
    ck_assert(got.origins[i].client == orig[i].client &&
              got.origins[i].request == orig[i].request && got.origins[i].steps == orig[i].steps);
  ck_assert(got.has_rng);
  ck_assert(got.rng_offset == 0xfedcba9876543210ull);
  pe_model_mark_release(&got);
  ck_assert_int_eq(nd, 3);
  /* Sorted by name. */
  ck_assert_str_eq(d[0].name, "a_step");
  ck_assert_str_eq(d[1].name, "empty");
  ck_assert_str_eq(d[2].name, "w");
  ck_assert_int_eq(d[0].t.dtype, PE_I64);
  ck_assert_int_eq(pe_i64(&d[0].t)[0], 123456789012345LL);
  expect_shape(&d[1].t.shape, PE_SHAPE(0, 7));
  ck_assert_int_eq(d[1].t.dtype, PE_F64);
  expect_shape(&d[2].t.shape, PE_SHAPE(3, 4));
  ck_assert_int_eq(memcmp(d[2].t.data, e[0].t.data, 48), 0);
  /* Encoding is deterministic: the decoded set encodes to the same bytes. */
  uint8_t *buf2;
  size_t len2;
  PE_CK_OK(pe_ckpt_encode(d, nd, &mark, &buf2, &len2));
  ck_assert_uint_eq(len, len2);
  ck_assert_int_eq(memcmp(buf, buf2, len), 0);
  free(buf2);
  pe_ckpt_entries_free(d, nd);

  /* Every single-byte corruption and every truncation is caught. */
  for (size_t i = 0; i < len; i++) {
    buf[i] ^= 0x40;
    pe_status *st = pe_ckpt_decode(buf, len, "mem", &d, &nd, NULL);
    ck_assert_msg(st != NULL, "flip at byte %zu not detected", i);
    ck_assert_int_eq(pe_status_code(st), PE_ECORRUPT);
    pe_status_free(st);
    buf[i] ^= 0x40;
  }
  for (size_t cut = 0; cut < len; cut += 7) {
    pe_status *st = pe_ckpt_decode(buf, cut, "mem", &d, &nd, NULL);
    ck_assert_msg(st != NULL, "truncation to %zu bytes not detected", cut);
    pe_status_free(st);
  }
  /* A file cut short says so, with a length it needs at least (it said
   * 'CRC mismatch'); a flipped byte stays a CRC mismatch. */
  for (size_t cut = 16; cut < 180 + 20; cut++) { /* to w's end and a trailer without origins */
    pe_status *st = pe_ckpt_decode(buf, cut, "mem", &d, &nd, NULL);
    char want[64];
    snprintf(want, sizeof want, "checkpoint mem: truncated: %zu of at least ", cut);
    ck_assert_msg(st && !strncmp(pe_status_msg(st), want, strlen(want)), "cut at %zu: %s", cut,
                  st ? pe_status_msg(st) : "decoded");
    unsigned long long need = strtoull(pe_status_msg(st) + strlen(want), NULL, 10);
    ck_assert_msg(need > cut && need <= len, "cut at %zu of %zu: needs %llu", cut, len, need);
    pe_status_free(st);
  }
  {
    /* In w's data: its end (180) and the trailer without the origins it
     * cannot count (20 of 60 bytes). */
    ck_assert_uint_eq(len, 240);
    pe_status *st = pe_ckpt_decode(buf, 150, "mem", &d, &nd, NULL);
    ck_assert_str_eq(pe_status_msg(st),
                     "checkpoint mem: truncated: 150 of at least 200 bytes (the file ends in "
                     "tensor 3 of 3; a copy or write cut short?)");
    pe_status_free(st);
  }
  for (size_t i = 0; i < len; i++) {
    buf[i] ^= 0x40;
    pe_status *st = pe_ckpt_decode(buf, len, "mem", &d, &nd, NULL);
    ck_assert_msg(!strstr(pe_status_msg(st), "truncated"), "flip at %zu: %s", i, pe_status_msg(st));
    pe_status_free(st);
    buf[i] ^= 0x40;
  }
  free(buf);
  pe_ckpt_entries_free(e, n);
}
END_TEST

/* Turn a version 03 encoding into an older one: drop the generator record
 * (12 bytes before the CRC) and, for 01, the origin count (4 more; the
 * encoding must have no origins), then fix the magic and the CRC. */
static void downgrade(uint8_t *buf, size_t *len, char version) {
  *len -= 12 + (version == '1' ? 4 : 0);
  buf[7] = (uint8_t)version;
  uint32_t crc = pe_crc32(buf, *len - 4);
  memcpy(buf + *len - 4, &crc, 4);
}

/* Version 01 (no run origins) and 02 (no generator record) files still
 * load, without what they lack; lying counts and flags under a valid CRC
 * are refused. */
START_TEST(test_old_versions_and_lying_records) {
  pe_ckpt_entry *e;
  int n;
  make_entries(&e, &n);
  uint8_t *buf;
  size_t len;
  pe_run_origin orig = {9, 3, 2};
  pe_model_mark mark = {.origins = &orig, .n_origins = 1, .has_rng = true, .rng_offset = 77};
  pe_ckpt_entry *d;
  int nd;
  pe_model_mark got;
  /* v2: the origins, no generator. */
  PE_CK_OK(pe_ckpt_encode(e, n, &mark, &buf, &len));
  downgrade(buf, &len, '2');
  PE_CK_OK(pe_ckpt_decode(buf, len, "v2", &d, &nd, &got));
  ck_assert_int_eq(nd, 3);
  ck_assert_int_eq(got.n_origins, 1);
  ck_assert(got.origins[0].client == 9 && got.origins[0].request == 3);
  ck_assert(!got.has_rng);
  pe_model_mark_release(&got);
  pe_ckpt_entries_free(d, nd);
  free(buf);
  /* v1: neither. */
  PE_CK_OK(pe_ckpt_encode(e, n, NULL, &buf, &len));
  downgrade(buf, &len, '1');
  PE_CK_OK(pe_ckpt_decode(buf, len, "v1", &d, &nd, &got));
  ck_assert_int_eq(nd, 3);
  ck_assert_int_eq(got.n_origins, 0);
  ck_assert_ptr_null(got.origins);
  ck_assert(!got.has_rng);
  pe_ckpt_entries_free(d, nd);
  free(buf);
  /* v3 with a huge origin count and a valid CRC. */
  PE_CK_OK(pe_ckpt_encode(e, n, NULL, &buf, &len));
  uint32_t lie = 0x10000000;
  memcpy(buf + len - 20, &lie, 4);
  uint32_t crc = pe_crc32(buf, len - 4);
  memcpy(buf + len - 4, &crc, 4);
  expect_error(pe_ckpt_decode(buf, len, "lie", &d, &nd, &got), PE_ECORRUPT, "run origin count");
  free(buf);
  /* v3 with a generator flag other than 0 or 1. */
  PE_CK_OK(pe_ckpt_encode(e, n, &mark, &buf, &len));
  lie = 2;
  memcpy(buf + len - 16, &lie, 4);
  crc = pe_crc32(buf, len - 4);
  memcpy(buf + len - 4, &crc, 4);
  expect_error(pe_ckpt_decode(buf, len, "lie", &d, &nd, &got), PE_ECORRUPT, "generator record");
  free(buf);
  pe_ckpt_entries_free(e, n);
}
END_TEST

/* A format version this daemon does not read is named as such, before the
 * CRC (another version may check itself otherwise), with a valid CRC too. */
START_TEST(test_unknown_version_named) {
  pe_ckpt_entry *e;
  int n;
  make_entries(&e, &n);
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_ckpt_encode(e, n, NULL, &buf, &len));
  pe_ckpt_entry *d;
  int nd;
  buf[7] = '4';
  expect_error(pe_ckpt_decode(buf, len, "new.ckpt", &d, &nd, NULL), PE_ECORRUPT,
               "checkpoint new.ckpt: format version '04', this daemon reads versions 01 to 03");
  uint32_t crc = pe_crc32(buf, len - 4);
  memcpy(buf + len - 4, &crc, 4);
  expect_error(pe_ckpt_decode(buf, len, "new.ckpt", &d, &nd, NULL), PE_ECORRUPT,
               "format version '04'");
  buf[6] = 0x01; /* not printable */
  expect_error(pe_ckpt_decode(buf, len, "x", &d, &nd, NULL), PE_ECORRUPT, "version '?4'");
  memcpy(buf, "PECKPX03", 8); /* not ours at all */
  expect_error(pe_ckpt_decode(buf, len, "x", &d, &nd, NULL), PE_ECORRUPT, "not a pe checkpoint");
  free(buf);
  pe_ckpt_entries_free(e, n);
}
END_TEST

START_TEST(test_lying_counts_with_valid_crc) {
  /* A well-formed CRC over nonsense must still be bounds-checked. */
  uint8_t buf[8 + 4 + 4 + 4];
  memcpy(buf, "PECKPT01", 8);
  uint32_t n = 0x7fffffff;
  memcpy(buf + 8, &n, 4);
  uint32_t nl = 1000000;
  memcpy(buf + 12, &nl, 4);
  uint32_t crc = pe_crc32(buf, 16);
  memcpy(buf + 16, &crc, 4);
  pe_ckpt_entry *d;
  int nd;
  expect_error(pe_ckpt_decode(buf, sizeof buf, "lie", &d, &nd, NULL), PE_ECORRUPT, "lie");
  /* CRC-32 check value of "123456789". */
  ck_assert_uint_eq(pe_crc32((const uint8_t *)"123456789", 9), 0xCBF43926u);
}
END_TEST

/* A tensor with a zero dimension has no bytes whatever its other
 * dimensions; those must still multiply within bounds (the code that takes
 * a loaded value multiplies inner dimensions): refused, naming the shape. */
START_TEST(test_zero_dim_with_huge_dims_refused) {
  const int64_t big = INT64_C(1) << 40;
  pe_ckpt_entry e = {.name = (char *)"fc_0.w"};
  e.t.dtype = PE_F32;
  e.t.shape = PE_SHAPE(0, big, big);
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_ckpt_encode(&e, 1, NULL, &buf, &len));
  pe_ckpt_entry *d;
  int nd;
  expect_error(pe_ckpt_decode(buf, len, "zero.ckpt", &d, &nd, NULL), PE_ECORRUPT,
               "checkpoint zero.ckpt: tensor 'fc_0.w': shape [0,1099511627776,1099511627776] "
               "has more than 1099511627776 elements");
  free(buf);
  /* Within bounds, a zero dimension is a tensor like any other. */
  e.t.shape = PE_SHAPE(0, big);
  PE_CK_OK(pe_ckpt_encode(&e, 1, NULL, &buf, &len));
  PE_CK_OK(pe_ckpt_decode(buf, len, "zero.ckpt", &d, &nd, NULL));
  ck_assert_int_eq(nd, 1);
  ck_assert_int_eq(pe_tensor_numel(&d[0].t), 0);
  pe_ckpt_entries_free(d, nd);
  free(buf);
}
END_TEST

START_TEST(test_atomic_write) {
  char dir[] = "/tmp/pe-ckpt-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char sub[256];
  snprintf(sub, sizeof sub, "%s/models/m", dir);
  PE_CK_OK(pe_mkdir_p(sub, 0750));
  PE_CK_OK(pe_mkdir_p(sub, 0750)); /* exists: fine */
  PE_CK_OK(pe_write_atomic(sub, "c.ckpt", (const uint8_t *)"first", 5));
  PE_CK_OK(pe_write_atomic(sub, "c.ckpt", (const uint8_t *)"second!", 7));
  char path[300];
  snprintf(path, sizeof path, "%s/c.ckpt", sub);
  uint8_t *buf;
  size_t len;
  PE_CK_OK(pe_read_file(path, 1 << 20, &buf, &len));
  ck_assert_uint_eq(len, 7);
  ck_assert_int_eq(memcmp(buf, "second!", 7), 0);
  free(buf);
  /* No temporary files left behind. */
  DIR *dd = opendir(sub);
  int files = 0;
  struct dirent *de;
  while ((de = readdir(dd)))
    if (de->d_name[0] != '.') {
      files++;
      ck_assert_str_eq(de->d_name, "c.ckpt");
    }
  closedir(dd);
  ck_assert_int_eq(files, 1);
  expect_error(pe_read_file(path, 3, &buf, &len), PE_EIO, "larger than 3");
  snprintf(path, sizeof path, "%s/missing.ckpt", sub);
  expect_error(pe_read_file(path, 1 << 20, &buf, &len), PE_ENOTFOUND, "missing.ckpt");
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("server_checkpoint_file");
  TCase *tc = tcase_create("checkpoint");
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_lying_counts_with_valid_crc);
  tcase_add_test(tc, test_old_versions_and_lying_records);
  tcase_add_test(tc, test_unknown_version_named);
  tcase_add_test(tc, test_zero_dim_with_huge_dims_refused);
  tcase_add_test(tc, test_atomic_write);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
