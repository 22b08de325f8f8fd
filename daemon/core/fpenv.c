/* Denormal flushing per architecture (see fpenv.h for why). */
#include "core/fpenv.h"

#if defined(__x86_64__)
#include <stdatomic.h>
#include <string.h>
#include <xmmintrin.h>

/* MXCSR: bit 15 flush-to-zero (denormal results -> 0), bit 6
 * denormals-are-zero (denormal inputs read as 0). */
#define MXCSR_FTZ 0x8000u
#define MXCSR_DAZ 0x0040u

/* DAZ is missing on a few early x86-64 CPUs, where setting it faults. The
 * MXCSR_MASK that FXSAVE stores (bytes 28..31; 0 means the default 0xFFBF,
 * without DAZ) says which bits this CPU accepts. Computed once; racing
 * first callers compute the same value. */
static unsigned flush_bits(void) {
  static _Atomic unsigned bits;
  unsigned b = atomic_load_explicit(&bits, memory_order_relaxed);
  if (b) return b;
  _Alignas(16) unsigned char area[512];
  memset(area, 0, sizeof area);
  __asm__ __volatile__("fxsave %0" : "=m"(area));
  unsigned mask;
  memcpy(&mask, area + 28, sizeof mask);
  if (!mask) mask = 0xFFBFu;
  b = MXCSR_FTZ | (mask & MXCSR_DAZ);
  atomic_store_explicit(&bits, b, memory_order_relaxed);
  return b;
}
#define FLUSH_BITS flush_bits()

static unsigned read_ctl(void) {
  return _mm_getcsr();
}
static void write_ctl(unsigned v) {
  _mm_setcsr(v);
}
#define PE_FPENV_HAVE 1

#elif defined(__aarch64__)
#include <stdint.h>

/* FPCR.FZ (bit 24) flushes denormal inputs and results of single and
 * double precision. */
#define FLUSH_BITS (1u << 24)

static unsigned read_ctl(void) {
  uint64_t v;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(v));
  return (unsigned)v;
}
static void write_ctl(unsigned v) {
  uint64_t w = v;
  __asm__ __volatile__("msr fpcr, %0" : : "r"(w));
}
#define PE_FPENV_HAVE 1

#else
#define PE_FPENV_HAVE 0
#endif

#if PE_FPENV_HAVE

bool pe_fpenv_supported(void) {
  return true;
}

bool pe_fpenv_flush_denormals(bool on) {
  unsigned v = read_ctl();
  write_ctl(on ? v | FLUSH_BITS : v & ~FLUSH_BITS);
  return true;
}

bool pe_fpenv_denormals_flushed(void) {
  return (read_ctl() & FLUSH_BITS) == FLUSH_BITS;
}

pe_fpenv_state pe_fpenv_save(void) {
  return read_ctl() & FLUSH_BITS;
}

void pe_fpenv_restore(pe_fpenv_state saved) {
  /* Only our bits: exception flags raised meanwhile stay visible. */
  write_ctl((read_ctl() & ~FLUSH_BITS) | (saved & FLUSH_BITS));
}

#else

bool pe_fpenv_supported(void) {
  return false;
}
bool pe_fpenv_flush_denormals(bool on) {
  (void)on;
  return false;
}
bool pe_fpenv_denormals_flushed(void) {
  return false;
}
pe_fpenv_state pe_fpenv_save(void) {
  return 0;
}
void pe_fpenv_restore(pe_fpenv_state saved) {
  (void)saved;
}

#endif
