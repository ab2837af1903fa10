/* backend/cpu/avx512: the kernels of simd_impl.h with 512-bit vectors. Compiled with
 * -mavx512f -mavx512bw -mavx512vl -mavx512dq (+ AVX2/FMA/F16C) only (CMakeLists.txt); used when
 * cpu.c finds those enabled by the CPU and the OS. */
#define DSP_SIMD_AVX512 1
#include "backend/cpu/simd_impl.h"
