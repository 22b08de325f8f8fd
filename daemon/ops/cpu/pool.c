/* Placeholder table; filled in by the op implementation. */
#include "ops/op_tables.h"

const pe_op_def pe_ops_pool[] = {{0}};
