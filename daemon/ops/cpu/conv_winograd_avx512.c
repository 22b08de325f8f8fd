/* pe's Winograd kernels on AVX-512 (F): 16 channels per vector. */
#include <immintrin.h>

#define WINO_LANES 16
#define VEC __m512
#define V_LOADU(p) _mm512_loadu_ps(p)
#define V_STOREU(p, v) _mm512_storeu_ps(p, v)
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_FMADD(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_FNMADD(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define WINO_TARGET __attribute__((target("avx512f")))
#define WINO_TABLE pe_wino_kernels_avx512

#include "ops/cpu/conv_winograd_kernels.h"
