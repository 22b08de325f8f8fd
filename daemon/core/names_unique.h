/* Refusing a list that names something twice, in time linear in the list
 * (a hash set of its names): the requests' name lists (get/set_params,
 * run feeds and fetches, register keep) and the program's op slots and
 * attributes. A repeated name would make the daemon copy a value once per
 * repeat; a pairwise check would take seconds on a large list.
 * Threads: any; no shared state. */
#ifndef PE_CORE_NAMES_UNIQUE_H
#define PE_CORE_NAMES_UNIQUE_H

#include <stddef.h>

#include "core/status.h"

/* The name of entry i of list (NULL: the entry has none and is skipped). */
typedef const char *pe_name_at_fn(const void *list, size_t i);

/* For a list of strings (const char *const *). */
const char *pe_name_at_str(const void *list, size_t i);

/* NULL when the names of list[0..n) all differ. Else PE_EINVAL
 * "<what> '<name>' is repeated (entries I and J); give each once" for the
 * first entry J whose name an earlier entry I has, or PE_ENOMEM. */
pe_status *pe_names_unique(const void *list, size_t n, pe_name_at_fn *at, const char *what);

#endif
