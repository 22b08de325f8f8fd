/* Checkpoint and model names (see checkpoint/file.h). */
#include "server/checkpoint/file.h"

#include <string.h>

bool pe_name_valid(const char *name) {
  if (!name || !name[0] || name[0] == '.') return false;
  size_t n = strlen(name);
  if (n > PE_NAME_MAX) return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

pe_status *pe_name_check(const char *what, const char *name) {
  if (pe_name_valid(name)) return NULL;
  if (!name || !name[0]) return pe_error(PE_EINVAL, "%s is empty", what);
  if (name[0] == '.') return pe_error(PE_EINVAL, "%s '%.80s' must not start with '.'", what, name);
  if (strlen(name) > PE_NAME_MAX)
    return pe_error(PE_EINVAL, "%s '%.80s...' is longer than %d characters", what, name,
                    PE_NAME_MAX);
  return pe_error(PE_EINVAL, "%s '%.80s' has characters outside [A-Za-z0-9._-] (no '/')", what,
                  name);
}
