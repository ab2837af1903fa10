/* backend/cpu/cpu: run-time choice of the kernel table (see ops.h).
 *
 * A table is usable when the CPU reports its instructions (cpuid) AND the OS saves the registers
 * they use (xgetbv: XCR0 has the YMM state for AVX2, plus opmask/ZMM state for AVX-512). This file
 * is compiled without ISA flags, so it runs anywhere. */
#include "backend/cpu/ops.h"

#include <cpuid.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

typedef struct cpu_feat {
    bool avx2, avx512;
} cpu_feat;

static cpu_feat detect(void) {
    cpu_feat f = {false, false};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29), avx = c & (1u << 28);
    if (!osxsave || !avx) return f;
    uint64_t xcr0 = xgetbv0();
    bool ymm_os = (xcr0 & 0x6) == 0x6;            /* SSE + AVX state */
    bool zmm_os = ymm_os && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    if (__get_cpuid_max(0, NULL) < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
         avx512vl = b & (1u << 31);
    f.avx2 = ymm_os && avx2 && fma && f16c;
    f.avx512 = f.avx2 && zmm_os && avx512f && avx512dq && avx512bw && avx512vl;
    return f;
}

const char *dsp_cpu_isa_supported(void) {
    cpu_feat f = detect();
    return f.avx512 ? "avx512" : f.avx2 ? "avx2" : "scalar";
}

const dsp_cpu_ops *dsp_cpu_ops_get(const char *name) {
    cpu_feat f = detect();
    if (!strcmp(name, "scalar")) return &dsp_cpu_ops_scalar;
    if (!strcmp(name, "avx2")) return f.avx2 ? &dsp_cpu_ops_avx2 : NULL;
    if (!strcmp(name, "avx512")) return f.avx512 ? &dsp_cpu_ops_avx512 : NULL;
    return NULL;
}

static const dsp_cpu_ops *choose(void) {
    static const char *const order[] = {"avx512", "avx2", "scalar"};
    const char *cap = getenv("DSP_CPU_ISA");
    int start = 0;
    if (cap && *cap)
        for (int i = 0; i < 3; i++)
            if (!strcmp(cap, order[i])) start = i;
    for (int i = start; i < 3; i++) {
        const dsp_cpu_ops *o = dsp_cpu_ops_get(order[i]);
        if (o) return o;
    }
    return &dsp_cpu_ops_scalar;
}

const dsp_cpu_ops *dsp_cpu_ops_best(void) {
    static const dsp_cpu_ops *_Atomic chosen;
    const dsp_cpu_ops *o = chosen;
    if (!o) chosen = o = choose(); /* idempotent: a race picks the same table twice */
    return o;
}
