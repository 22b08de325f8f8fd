/* Shared-memory feeds when the daemon runs as another user, as the
 * installed service does (User=pe-executord) while trainers run as
 * themselves: pe_client_shm_create gives the daemon's user, and no one
 * else, read access (a POSIX ACL entry), the daemon maps the region and
 * the run equals one with inline feeds; a region without that access is
 * refused with a message naming the daemon's uid, and the daemon serves on.
 *
 * The daemon runs as "nobody", so the suite needs root (skipped, 77,
 * otherwise, and when pe-executord is not built). */
#include <acl/libacl.h>
#include <check.h>
#include <fcntl.h>
#include <pwd.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/acl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_daemon.h"
#include "pe_client.h"
#include "pe_models.h"

#define BATCH 16

typedef struct batch {
  float x[BATCH * 784];
  int64_t y[BATCH];
} batch;

static uid_t other_uid;
static gid_t other_gid;

typedef struct fixture {
  cd_daemon d;
  pe_client *c;
  pe_model_spec m;
  batch b;
  uint64_t h;
} fixture;

static void setup(fixture *f) {
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &f->m, err, sizeof err) == 0, "%s", err);
  uint32_t s = 11;
  for (int i = 0; i < BATCH * 784; i++) {
    s = s * 1664525u + 1013904223u;
    f->b.x[i] = (float)(s >> 8) / (float)(1u << 24);
  }
  for (int i = 0; i < BATCH; i++) f->b.y[i] = i % 10;
  cd_start_as(&f->d, other_uid, other_gid);
  f->c = cd_connect(&f->d);
  const char *keep[] = {f->m.loss};
  pe_client_register_args a = {.program = f->m.bytes,
                               .program_len = f->m.len,
                               .model = "other-user",
                               .places = "cpu:1",
                               .seed = 3,
                               .keep = keep,
                               .n_keep = 1,
                               .for_test = true};
  pe_client_program p;
  CD_OK(f->c, pe_client_register(f->c, &a, &p));
  f->h = p.handle;
  bool inited = false;
  CD_OK(f->c, pe_client_init(f->c, f->h, false, &inited));
}

static void teardown(fixture *f) {
  pe_client_free(f->c);
  cd_stop(&f->d);
  pe_model_spec_release(&f->m);
}

/* The loss of one evaluation; shm: the region holding f->b, or NULL for
 * inline feeds. */
static float eval_loss(fixture *f, const pe_client_shm *shm) {
  pe_client_tensor feeds[2];
  pe_client_tensor_set(&feeds[0], f->m.image, PE_B_F32, 2, (int64_t[]){BATCH, 784}, f->b.x);
  pe_client_tensor_set(&feeds[1], f->m.label, PE_B_I64, 2, (int64_t[]){BATCH, 1}, f->b.y);
  if (shm) {
    feeds[0].shm_region = feeds[1].shm_region = shm->region;
    feeds[0].shm_offset = offsetof(batch, x);
    feeds[1].shm_offset = offsetof(batch, y);
  }
  const char *fetch[] = {f->m.loss};
  pe_client_run_result r;
  CD_OK(f->c, pe_client_run(f->c, f->h, feeds, 2, fetch, 1, NULL, &r));
  return ((const float *)r.fetched[0].data)[0];
}

START_TEST(daemon_of_another_user_reads_the_region) {
  fixture f;
  setup(&f);
  float inline_loss = eval_loss(&f, NULL);
  pe_client_shm shm;
  int rc = pe_client_shm_create(f.c, sizeof f.b, &shm);
  ck_assert_msg(rc == 0, "shm: %s", pe_client_error(f.c));
  memcpy(shm.base, &f.b, sizeof f.b);
  ck_assert_float_eq(eval_loss(&f, &shm), inline_loss);
  /* Who may read it: the owner (rw), the daemon's user (r), no one else. */
  char path[128];
  snprintf(path, sizeof path, "/dev/shm%s", shm.name);
  acl_t acl = acl_get_file(path, ACL_TYPE_ACCESS);
  ck_assert_ptr_nonnull(acl);
  char *text = acl_to_any_text(acl, NULL, ',', TEXT_NUMERIC_IDS);
  ck_assert_ptr_nonnull(text);
  char want[64];
  snprintf(want, sizeof want, "user:%u:r--", (unsigned)other_uid);
  ck_assert_msg(strstr(text, "user::rw-") && strstr(text, want) && strstr(text, "group::---") &&
                    strstr(text, "mask::r--") && strstr(text, "other::---"),
                "ACL of %s: %s", path, text);
  ck_assert_int_eq(acl_entries(acl), 5);
  acl_free(text);
  acl_free(acl);
  pe_client_shm_close(f.c, &shm);
  teardown(&f);
}
END_TEST

START_TEST(region_without_access_is_refused_naming_the_daemon_user) {
  fixture f;
  setup(&f);
  char name[64];
  snprintf(name, sizeof name, "/pe-e2e-noacl-%d", (int)getpid());
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, 4096), 0);
  ck_assert_int_eq(pe_client_shm_seal(fd, 4096), 0); /* the token it must prove */
  close(fd);
  uint64_t region = 0;
  int rc = pe_client_register_shm(f.c, name, 4096, &region);
  shm_unlink(name);
  char want[32];
  snprintf(want, sizeof want, "uid %u", (unsigned)other_uid);
  ck_assert_msg(rc != 0 && rc < PE_C_CLIENT_BASE && strstr(pe_client_error(f.c), name) &&
                    strstr(pe_client_error(f.c), "may not read it") &&
                    strstr(pe_client_error(f.c), want),
                "rc %d: %s", rc, pe_client_error(f.c));
  /* The daemon serves on, for this client too. */
  CD_OK(f.c, pe_client_ping(f.c));
  float loss = eval_loss(&f, NULL);
  ck_assert(loss > 0);
  teardown(&f);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("shm_other_user");
  TCase *tc = tcase_create("shm");
  tcase_add_test(tc, daemon_of_another_user_reads_the_region);
  tcase_add_test(tc, region_without_access_is_refused_naming_the_daemon_user);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  cd_require_binary("pe-executord");
  if (geteuid() != 0) {
    fprintf(stderr, "skip: running the daemon as another user needs root\n");
    return 77;
  }
  const struct passwd *pw = getpwnam("nobody");
  if (!pw) {
    fprintf(stderr, "skip: no user 'nobody' to run the daemon as\n");
    return 77;
  }
  other_uid = pw->pw_uid;
  other_gid = pw->pw_gid;
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
