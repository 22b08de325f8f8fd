/* pe-executord end to end, a restart checkpoint that cannot be read: a
 * trained persistent model's file is damaged while the daemon is down (a
 * byte flipped in the middle, cut in half (said as truncated, with the
 * length it needs), a format version this daemon
 * does not read, or not a checkpoint at all). The register after the
 * restart is refused naming the model, the file, why it cannot be read and
 * drop-model; the file stays byte for byte through the attempt, autosave
 * intervals, a register of a non-persistent program (refused alike), and
 * SIGTERM (before, the register went through
 * with fresh parameters and the next autosave or SIGTERM replaced the
 * file). drop-model removes the file; then the name starts afresh. */
#include "check_main.h"
#include "daemon_harness.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

#define CLIENT 0xbad1
#define FAST "[state]\ncheckpoint_interval = 0.2\n"

static uint8_t *read_all(const char *path, size_t *len) {
  uint8_t *buf;
  PE_CK_OK(pe_read_file(path, (size_t)1 << 30, &buf, len));
  return buf;
}

static void write_all(const char *path, const uint8_t *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

/* The file at path holds exactly want (len bytes). */
static void same_bytes(const char *path, const uint8_t *want, size_t len, const char *when) {
  size_t n;
  uint8_t *got = read_all(path, &n);
  ck_assert_msg(n == len && memcmp(got, want, len) == 0, "%s: %s changed (%zu bytes, was %zu)",
                when, path, n, len);
  free(got);
}

/* A register of mlp under "pm" (persistent or not) is refused: ECORRUPT,
 * naming the model, the file, why (needle) and the way out. */
static void refused_as(int s, const pe_model_spec *mlp, const char *path, const char *why,
                       bool persistent) {
  Pe__Reply *rep = dh_register_call(s, CLIENT, mlp, "pm", 3, persistent);
  ck_assert_msg(rep->code == PE_ECORRUPT, "code %d: %s", rep->code, rep->message);
  const char *needles[] = {"model 'pm'", path, "cannot be read", why, "drop-model --model pm"};
  for (size_t i = 0; i < sizeof needles / sizeof *needles; i++)
    ck_assert_msg(strstr(rep->message, needles[i]), "'%s' not in: %s", needles[i], rep->message);
  pe__reply__free_unpacked(rep, NULL);
}

static void refused(int s, const pe_model_spec *mlp, const char *path, const char *why) {
  refused_as(s, mlp, path, why, true);
}

typedef struct damage {
  const char *what, *why;
} damage;

/* bad: a damaged copy of good (len) as `kind` says; *bad_len its size. */
static uint8_t *damaged(const uint8_t *good, size_t len, int kind, size_t *bad_len) {
  static const char junk[] = "not a checkpoint, but someone's only copy";
  uint8_t *bad = malloc(len);
  memcpy(bad, good, len);
  *bad_len = len;
  switch (kind) {
    case 0: bad[len / 2] ^= 0x10; break;
    case 1: *bad_len = len / 2; break;
    case 2: bad[6] = '0', bad[7] = '9'; break;
    default: memcpy(bad, junk, sizeof junk - 1); *bad_len = sizeof junk - 1;
  }
  return bad;
}

static const damage kinds[] = {{"a byte flipped", "CRC mismatch"},
                               {"cut in half", "truncated: "},
                               {"version 09", "format version '09', this daemon reads versions 01"},
                               {"not a checkpoint", "not a pe checkpoint"}};

START_TEST(test_unreadable_restart_checkpoint_kept) {
  dh_daemon d = {0};
  dh_start(&d, FAST);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "pm", 3, true, NULL);
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 2);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  char path[512];
  snprintf(path, sizeof path, "%s/models/pm/shutdown.ckpt", d.state);
  size_t len;
  uint8_t *good = read_all(path, &len);

  for (int k = 0; k < (int)(sizeof kinds / sizeof *kinds); k++) {
    size_t bad_len;
    uint8_t *bad = damaged(good, len, k, &bad_len);
    write_all(path, bad, bad_len);
    dh_start(&d, FAST);
    s = dh_connect(&d, 30000);
    refused(s, &mlp, path, kinds[k].why);
    same_bytes(path, bad, bad_len, kinds[k].what);
    /* Again: a refusal changes nothing, and the daemon keeps serving. */
    refused(s, &mlp, path, kinds[k].why);
    ck_assert(dh_ping(s));
    /* A program that is not persistent restores the file too (a model's
     * first register does, test_restart_any_register): refused alike, so
     * no values that did not come from the file can be made persistent. */
    refused_as(s, &mlp, path, kinds[k].why, false);
    dh_sleep_ms(700); /* over 3 autosave intervals */
    same_bytes(path, bad, bad_len, kinds[k].what);
    nn_close(s);
    ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
    same_bytes(path, bad, bad_len, kinds[k].what);
    free(bad);
  }

  /* drop-model discards the file; the name starts afresh and persists. */
  dh_start(&d, FAST);
  s = dh_connect(&d, 30000);
  Pe__Request rq = dh_req(CLIENT);
  Pe__DropModelRequest dr = PE__DROP_MODEL_REQUEST__INIT;
  dr.model = (char *)"pm";
  rq.body_case = PE__REQUEST__BODY_DROP_MODEL;
  rq.drop_model = &dr;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  ck_assert(!rep->drop_model->freed);
  ck_assert_str_eq(rep->drop_model->removed, path);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert_int_ne(access(path, F_OK), 0);
  h = dh_register(s, CLIENT, &mlp, "pm", 3, true, NULL, &rep);
  ck_assert(!rep->register_->has_values);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(dh_init_ok(s, CLIENT, h));
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  free(read_all(path, &len));

  free(good);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("restart_unreadable");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_unreadable_restart_checkpoint_kept);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
