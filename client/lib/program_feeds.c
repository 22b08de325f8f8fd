/* pe_program_feed (pe_feed_data.h): a feed's dtype and shape as the
 * ProgramDesc declares them, so that a data reader checks the user's
 * arrays before the daemon sees a batch. */
#include <stdio.h>
#include <string.h>

#include "pe_feed_data.h"
#include "program.pb-c.h"

int pe_program_feed(const uint8_t *program, size_t len, const char *name, pe_feed_decl *out,
                    char *err, size_t errlen) {
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, len, program);
  if (!pd) {
    snprintf(err, errlen, "the model's program cannot be decoded");
    return -1;
  }
  int rc = -1;
  const Pe__BlockDesc *b = pd->main_block >= 0 && (size_t)pd->main_block < pd->n_blocks
                               ? pd->blocks[pd->main_block]
                               : NULL;
  const Pe__VarDesc *v = NULL;
  for (size_t i = 0; b && i < b->n_vars && !v; i++)
    if (!strcmp(b->vars[i]->name, name)) v = b->vars[i];
  if (!v)
    snprintf(err, errlen, "the model has no variable '%s'", name);
  else if (!v->is_feed)
    snprintf(err, errlen, "the model's variable '%s' is not a feed", name);
  else if (v->n_shape < 1 || v->n_shape > PE_FEED_MAX_DIMS)
    snprintf(err, errlen, "the model's feed '%s' has %zu dims (1 to %d)", name, v->n_shape,
             PE_FEED_MAX_DIMS);
  else {
    *out = (pe_feed_decl){.dtype = (int)v->dtype, .ndim = (int)v->n_shape};
    snprintf(out->name, sizeof out->name, "%s", name);
    memcpy(out->dims, v->shape, v->n_shape * sizeof *v->shape);
    rc = 0;
  }
  pe__program_desc__free_unpacked(pd, NULL);
  return rc;
}
