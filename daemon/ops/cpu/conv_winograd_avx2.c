/* pe's Winograd kernels on AVX2 and FMA: 8 channels per vector. */
#include <immintrin.h>

#define WINO_LANES 8
#define VEC __m256
#define V_LOADU(p) _mm256_loadu_ps(p)
#define V_STOREU(p, v) _mm256_storeu_ps(p, v)
#define V_SET1(x) _mm256_set1_ps(x)
#define V_ZERO() _mm256_setzero_ps()
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_SUB(a, b) _mm256_sub_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_FMADD(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_FNMADD(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define WINO_TARGET __attribute__((target("avx2,fma")))
#define WINO_TABLE pe_wino_kernels_avx2

#include "ops/cpu/conv_winograd_kernels.h"
