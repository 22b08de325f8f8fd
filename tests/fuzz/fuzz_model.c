/* Model files (conf/models/README.md): the text `pe-client train --model
 * FILE` and pe-bench read, parsed by libpeclient into a ProgramDesc through
 * the program builder (pe_model_file_parse). A file that parses yields
 * program bytes, which are then decoded and validated as the daemon does
 * at register (a refusal there is an answer, not a failure: the builder
 * leaves some checks, e.g. sizes, to the daemon). */
#include <stdlib.h>

#include "ir/program.h"
#include "compiler/validate.h"
#include "core/log.h"
#include "pe_model_file.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  pe_log_set_level(PE_LOG_ERROR);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pe_model_spec spec;
  char err[512];
  if (pe_model_file_parse((const char *)data, size, "fuzz", &spec, err, sizeof err) != 0) return 0;
  pe_program *p = NULL;
  pe_status *st = pe_program_decode(spec.bytes, spec.len, &p);
  if (!st) st = pe_program_validate(p);
  pe_status_free(st);
  pe_program_free(p);
  pe_model_spec_release(&spec);
  return 0;
}
