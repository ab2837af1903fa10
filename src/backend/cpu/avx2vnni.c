/* backend/cpu/avx2vnni: the kernels of simd_impl.h with 256-bit vectors and AVX-VNNI (vpdpbusd)
 * for the 8-bit dot products. Compiled with -mavx2 -mfma -mf16c -mavxvnni only (CMakeLists.txt);
 * used when cpu.c finds AVX2+FMA+F16C and AVX-VNNI enabled. Results equal the avx2 table's. */
#define DSP_Q8_VNNI 1
#include "backend/cpu/simd_impl.h"
