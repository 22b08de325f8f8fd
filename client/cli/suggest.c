/* cli_edit_distance, cli_is_close (suggest.h). */
#include "suggest.h"

#include <stdint.h>
#include <string.h>

#define WORD_MAX 64

static size_t min3(size_t a, size_t b, size_t c) {
  size_t m = a < b ? a : b;
  return m < c ? m : c;
}

size_t cli_edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > WORD_MAX || m > WORD_MAX) return SIZE_MAX;
  /* Three rows of the dynamic programme: i - 2, i - 1 and i. */
  size_t rows[3][WORD_MAX + 1];
  for (size_t j = 0; j <= m; j++) rows[0][j] = j;
  for (size_t i = 1; i <= n; i++) {
    /* (i + 1) % 3 is (i - 2) % 3, read only from i = 2. */
    size_t *cur = rows[i % 3], *prev = rows[(i - 1) % 3], *prev2 = rows[(i + 1) % 3];
    cur[0] = i;
    for (size_t j = 1; j <= m; j++) {
      size_t cost = a[i - 1] != b[j - 1];
      cur[j] = min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          prev2[j - 2] + 1 < cur[j])
        cur[j] = prev2[j - 2] + 1;
    }
  }
  return rows[n % 3][m];
}

int cli_is_close(const char *typed, const char *known) {
  size_t d = cli_edit_distance(typed, known);
  size_t longer = strlen(typed) > strlen(known) ? strlen(typed) : strlen(known);
  return d > 0 && d != SIZE_MAX && 3 * d <= (longer < 3 ? 3 : longer);
}
