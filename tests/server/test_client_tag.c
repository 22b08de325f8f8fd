/* Client tags (server/client_tag.h): "c-" and 8 hex digits, the same for
 * the same id within a run, different for different ids (but for rare
 * collisions), and holding no run of the id's hex digits. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "server/client_tag.h"

START_TEST(test_tag_is_stable_and_hides_the_id) {
  const uint64_t id = 0x1cc6de58d3faa999ULL;
  pe_client_tag_buf a = pe_client_tag(id), b = pe_client_tag(id);
  ck_assert_str_eq(a.s, b.s);
  ck_assert_uint_eq(strlen(a.s), 10);
  ck_assert(!strncmp(a.s, "c-", 2) && strspn(a.s + 2, "0123456789abcdef") == 8);
  char hex[17];
  snprintf(hex, sizeof hex, "%016" PRIx64, id);
  ck_assert_msg(strncmp(a.s + 2, hex, 8) && strncmp(a.s + 2, hex + 8, 8), "%s shows %s", a.s, hex);
  /* Neighbouring ids (a counter, say) get unrelated tags. */
  int same = 0;
  pe_client_tag_buf prev = pe_client_tag(1);
  for (uint64_t i = 2; i < 2000; i++) {
    pe_client_tag_buf t = pe_client_tag(i);
    same += !strcmp(t.s, prev.s);
    prev = t;
  }
  ck_assert_int_eq(same, 0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_tag");
  TCase *tc = tcase_create("tag");
  tcase_add_test(tc, test_tag_is_stable_and_hides_the_id);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
