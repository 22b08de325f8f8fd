/* "did you mean ...": the known word closest to a mistyped one (an option
 * or a command name), offered only when it is close. */
#ifndef PE_CLI_SUGGEST_H
#define PE_CLI_SUGGEST_H

#include <stddef.h>

/* The optimal string alignment distance between a and b (insertions,
 * deletions, substitutions and swaps of two adjacent characters, each 1).
 * Words longer than 64 bytes count as far from everything (SIZE_MAX). */
size_t cli_edit_distance(const char *a, const char *b);

/* Whether `known` is close enough to `typed` to suggest: a distance of at
 * most a third of the longer word (at least 1), and not the same word. */
int cli_is_close(const char *typed, const char *known);

#endif
