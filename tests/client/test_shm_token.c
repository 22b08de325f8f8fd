/* Region trailers (common/shm_token.h): a trailer holds its token and
 * matches it only; a wrong token, one of another length, none, or a
 * trailer without the magic do not match; tokens are fresh. */
#include <string.h>

#include "check_main.h"
#include "shm_token.h"

START_TEST(test_trailer_matches_its_token_only) {
  uint8_t token[PE_SHM_TOKEN_LEN], other[PE_SHM_TOKEN_LEN], got[PE_SHM_TOKEN_LEN];
  ck_assert_int_eq(pe_shm_token_new(token), 0);
  ck_assert_int_eq(pe_shm_token_new(other), 0);
  ck_assert(memcmp(token, other, sizeof token)); /* 2^-128 */
  uint8_t trailer[PE_SHM_TRAILER];
  pe_shm_trailer_make(trailer, token);
  ck_assert(!memcmp(trailer, "pe-shmt1", 8));
  ck_assert(pe_shm_trailer_token(trailer, got));
  ck_assert(!memcmp(got, token, sizeof token));
  ck_assert(pe_shm_trailer_matches(trailer, token, sizeof token));
  ck_assert(!pe_shm_trailer_matches(trailer, other, sizeof other));
  ck_assert(!pe_shm_trailer_matches(trailer, token, sizeof token - 1));
  ck_assert(!pe_shm_trailer_matches(trailer, NULL, 0));
  /* One bit off in the token, then in the zero padding. */
  token[PE_SHM_TOKEN_LEN - 1] ^= 1;
  ck_assert(!pe_shm_trailer_matches(trailer, token, sizeof token));
  token[PE_SHM_TOKEN_LEN - 1] ^= 1;
  trailer[PE_SHM_TRAILER - 1] = 1;
  ck_assert(!pe_shm_trailer_matches(trailer, token, sizeof token));
  /* No magic: not a trailer (zeros: an object's data without one). */
  memset(trailer, 0, sizeof trailer);
  ck_assert(!pe_shm_trailer_token(trailer, got));
  uint8_t zeros[PE_SHM_TOKEN_LEN] = {0};
  ck_assert(!pe_shm_trailer_matches(trailer, zeros, sizeof zeros));
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("shm_token");
  TCase *tc = tcase_create("trailer");
  tcase_add_test(tc, test_trailer_matches_its_token_only);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
