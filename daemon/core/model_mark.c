/* Snapshot records (see core/model_mark.h). */
#include "core/model_mark.h"

#include <stdlib.h>

void pe_model_mark_release(pe_model_mark *mk) {
  if (!mk) return;
  free(mk->origins);
  *mk = (pe_model_mark){0};
}
