/* A ProgramDesc's counts off its wire bytes (see program_scan.h). */
#include "compiler/program_scan.h"

#include "core/pb_wire.h"

/* Field numbers of proto/program.proto. */
enum { PROGRAM_BLOCKS = 2, BLOCK_VARS = 3, BLOCK_OPS = 4 };
enum { OP_INPUTS = 2, OP_OUTPUTS = 3, OP_ATTRS = 4 };

#define MALFORMED(len) \
  pe_error(PE_EINVAL, "malformed ProgramDesc (%zu bytes): not a valid protobuf message", (len))

typedef struct counts {
  int64_t blocks, ops, vars;
} counts;

/* Op #oi of block bi: its slots and attributes against max (0: none). */
static pe_status *scan_op(const pe_pb_field *op, int64_t bi, int64_t oi, int max, size_t len) {
  static const char *const what[] = {
      [OP_INPUTS] = "input slots", [OP_OUTPUTS] = "output slots", [OP_ATTRS] = "attributes"};
  int64_t n[OP_ATTRS + 1] = {0};
  const uint8_t *p = op->data, *end = op->data + op->len;
  pe_pb_field f;
  while (p < end) {
    if (!pe_pb_next(&p, end, &f)) return MALFORMED(len);
    if (f.wire == PE_PB_LEN && f.number >= OP_INPUTS && f.number <= OP_ATTRS) n[f.number]++;
  }
  for (int k = OP_INPUTS; max > 0 && k <= OP_ATTRS; k++)
    if (n[k] > max)
      return pe_error(PE_EINVAL,
                      "ProgramDesc: block %lld: op #%lld: %lld %s, over the limit of %d per op",
                      (long long)bi, (long long)oi, (long long)n[k], what[k], max);
  return NULL;
}

static pe_status *scan_block(const pe_pb_field *b, const pe_decode_limits *lim, counts *c,
                             size_t len) {
  int64_t ops = 0;
  const uint8_t *p = b->data, *end = b->data + b->len;
  pe_pb_field f;
  while (p < end) {
    if (!pe_pb_next(&p, end, &f)) return MALFORMED(len);
    if (f.wire != PE_PB_LEN) continue;
    if (f.number == BLOCK_VARS) c->vars++;
    if (f.number == BLOCK_OPS) PE_TRY(scan_op(&f, c->blocks, ops++, lim->max_op_entries, len));
  }
  c->ops += ops;
  return NULL;
}

static pe_status *over_limit(const counts *c, int64_t n, const char *what, const char *key,
                             int64_t max) {
  return pe_error(PE_EINVAL, "ProgramDesc: %lld %s in its %lld block(s), over the limit %s = %lld",
                  (long long)n, what, (long long)c->blocks, key ? key : "", (long long)max);
}

pe_status *pe_program_scan(const uint8_t *buf, size_t len, const pe_decode_limits *lim) {
  counts c = {0};
  /* Empty bytes (an unset bytes field) may come as NULL, which takes no offset. */
  const uint8_t *p = buf, *end = len ? buf + len : buf;
  pe_pb_field f;
  while (p < end) {
    if (!pe_pb_next(&p, end, &f)) return MALFORMED(len);
    if (f.number != PROGRAM_BLOCKS || f.wire != PE_PB_LEN) continue;
    PE_TRY(scan_block(&f, lim, &c, len));
    c.blocks++;
  }
  if (lim->max_ops > 0 && c.ops > lim->max_ops)
    return over_limit(&c, c.ops, "ops", lim->ops_key, lim->max_ops);
  if (lim->max_vars > 0 && c.vars > lim->max_vars)
    return over_limit(&c, c.vars, "variables", lim->vars_key, lim->max_vars);
  return NULL;
}
