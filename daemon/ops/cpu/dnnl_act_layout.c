/* Blocked activations between aware ops (contract in dnnl_act_layout.h). */
#include "ops/cpu/dnnl_act_layout.h"

#include <stdatomic.h>
#include <string.h>

#include "ops/cpu/dnnl_util.h"

static atomic_int layout_mode = PE_CONV_LAYOUT_BLOCKED;

bool pe_conv_layout_parse(const char *s, int *mode) {
  if (!s) return false;
  if (strcmp(s, "plain") == 0)
    *mode = PE_CONV_LAYOUT_PLAIN;
  else if (strcmp(s, "blocked") == 0)
    *mode = PE_CONV_LAYOUT_BLOCKED;
  else
    return false;
  return true;
}

const char *pe_conv_layout_name(int mode) {
  return mode == PE_CONV_LAYOUT_PLAIN ? "plain" : "blocked";
}

void pe_conv_layout_set_mode(int mode) {
  atomic_store(&layout_mode, mode);
}

int pe_conv_layout_get_mode(void) {
  return atomic_load(&layout_mode);
}

int64_t pe_dnnl_act_block(void) {
  /* oneDNN's direct convolutions use 16-channel blocks where AVX-512 runs,
   * 8 on AVX2 and SSE4.1 (ONEDNN_MAX_CPU_ISA lowers the effective ISA). */
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core ? 16 : 8;
}

bool pe_dnnl_act_blocked(const pe_kernel_ctx *c, bool output, int slot) {
  int64_t bits = pe_attr_i(c->def, c->desc, PE_LAYOUT_ATTR);
  return (bits >> (slot + (output ? PE_LAYOUT_OUT_BIT : 0))) & 1;
}

/* Whether shape s is stored blocked when its variable is marked so. */
static bool act_applies(const pe_shape *s) {
  return s->ndim == 4 && s->d[1] % pe_dnnl_act_block() == 0;
}

dnnl_status_t pe_dnnl_act_md(dnnl_memory_desc_t *md, const pe_shape *s, bool blocked) {
  if (!blocked || !act_applies(s)) return pe_dnnl_md_of(md, s);
  dnnl_dims_t d = {s->d[0], s->d[1], s->d[2], s->d[3]};
  return dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32,
                                      pe_dnnl_act_block() == 16 ? dnnl_nChw16c : dnnl_nChw8c);
}

dnnl_status_t pe_dnnl_act_md_in(dnnl_memory_desc_t *md, const pe_kernel_ctx *c, int slot,
                                const pe_shape *s) {
  return pe_dnnl_act_md(md, s, pe_dnnl_act_blocked(c, false, slot));
}

dnnl_status_t pe_dnnl_act_md_out(dnnl_memory_desc_t *md, const pe_kernel_ctx *c, int slot,
                                 const pe_shape *s) {
  return pe_dnnl_act_md(md, s, pe_dnnl_act_blocked(c, true, slot));
}

pe_act_plane pe_act_plane_of(const pe_shape *s, bool blocked) {
  bool b = blocked && act_applies(s);
  return (pe_act_plane){s->d[1], s->d[2] * s->d[3], b ? pe_dnnl_act_block() : 1};
}

pe_status *pe_dnnl_act_tied(pe_kernel_ctx *c, uint32_t in_mask, uint32_t out_mask, bool *blocked) {
  int64_t bits = pe_attr_i(c->def, c->desc, PE_LAYOUT_ATTR), present = 0;
  for (int i = 0; i < 16; i++) {
    if ((in_mask >> i & 1) && pe_kin(c, i, 0)) present |= (int64_t)1 << i;
    if ((out_mask >> i & 1) && pe_kout(c, i, 0)) present |= (int64_t)1 << (PE_LAYOUT_OUT_BIT + i);
  }
  *blocked = bits != 0;
  if (bits == 0 || bits == present) return NULL;
  return pe_kernel_error(c, PE_EINVAL,
                         "attribute %s %#llx marks some activations blocked and others plain "
                         "(%#llx: all of them share one layout)",
                         PE_LAYOUT_ATTR, (long long)bits, (long long)present);
}
