/* backend/cpu/avx2: the kernels of simd_impl.h with 256-bit vectors. Compiled with
 * -mavx2 -mfma -mf16c only (CMakeLists.txt); used when cpu.c finds AVX2+FMA+F16C enabled. */
#include "backend/cpu/simd_impl.h"
