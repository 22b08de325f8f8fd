/* The daemon's INI configuration (server/config.h): a file read through
 * libinih on top of the embedded defaults, each key through the setter the
 * command line uses, then the cross-key checks and the comparison a SIGHUP
 * reload makes with the running config. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "server/config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  pe_log_set_level(PE_LOG_ERROR);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  pe_srv_config base = {0}, c = {0};
  pe_status *st = pe_config_defaults(&base);
  if (!st) st = pe_config_defaults(&c);
  if (!st) st = pe_config_load_string(&c, text, "fuzz.conf");
  if (!st) st = pe_config_check(&c);
  if (!st) {
    free(pe_config_restart_changes(&base, &c));
    pe_config_reloadable_apply(&base, &c);
  }
  pe_status_free(st);
  pe_config_free(&base);
  pe_config_free(&c);
  free(text);
  return 0;
}
