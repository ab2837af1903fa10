/* backend/cpu/avx512vnni: the kernels of simd_impl.h with 512-bit vectors and AVX512-VNNI
 * (vpdpbusd) for the 8-bit dot products. Compiled with the avx512.c flags + -mavx512vnni only
 * (CMakeLists.txt); used when cpu.c finds those enabled. Results equal the avx512 table's. */
#define DSP_SIMD_AVX512 1
#define DSP_Q8_VNNI 1
#include "backend/cpu/simd_impl.h"
