/* backend/cpu/cpu: run-time choice of the kernel table (see ops.h).
 *
 * A table is usable when the CPU reports its instructions (cpuid) AND the OS saves the registers
 * they use (xgetbv: XCR0 has the YMM state for AVX2, plus opmask/ZMM state for AVX-512). This file
 * is compiled without ISA flags, so it runs anywhere. */
#define _GNU_SOURCE /* syscall */
#include "backend/cpu/ops.h"

#include <cpuid.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

typedef struct cpu_feat {
    bool avx2, avx2vnni, avx512, avx512vnni;
} cpu_feat;

static cpu_feat detect(void) {
    cpu_feat f = {false, false, false, false};
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
    const bool avx512vnni = c & (1u << 11);
    unsigned a1 = 0, b1, c1, d1;
    if (a >= 1) __cpuid_count(7, 1, a1, b1, c1, d1); /* leaf 7's EAX: highest sub-leaf */
    const bool avxvnni = a1 & (1u << 4);
    f.avx2 = ymm_os && avx2 && fma && f16c;
    f.avx2vnni = f.avx2 && avxvnni;
    f.avx512 = f.avx2 && zmm_os && avx512f && avx512dq && avx512bw && avx512vl;
    f.avx512vnni = f.avx512 && avx512vnni;
    return f;
}

/* best first; DSP_CPU_ISA=NAME starts the search at NAME */
static const char *const g_order[] = {"avx512vnni", "avx512", "avx2vnni", "avx2", "scalar"};
#define N_ORDER (int)(sizeof g_order / sizeof *g_order)

const dsp_cpu_ops *dsp_cpu_ops_get(const char *name) {
    cpu_feat f = detect();
    if (!strcmp(name, "scalar")) return &dsp_cpu_ops_scalar;
    if (!strcmp(name, "avx2")) return f.avx2 ? &dsp_cpu_ops_avx2 : NULL;
    if (!strcmp(name, "avx2vnni")) return f.avx2vnni ? &dsp_cpu_ops_avx2vnni : NULL;
    if (!strcmp(name, "avx512")) return f.avx512 ? &dsp_cpu_ops_avx512 : NULL;
    if (!strcmp(name, "avx512vnni")) return f.avx512vnni ? &dsp_cpu_ops_avx512vnni : NULL;
    return NULL;
}

const char *dsp_cpu_isa_supported(void) {
    for (int i = 0; i < N_ORDER; i++)
        if (dsp_cpu_ops_get(g_order[i])) return g_order[i];
    return "scalar";
}

static const dsp_cpu_ops *choose(void) {
    const char *cap = getenv("DSP_CPU_ISA");
    int start = 0;
    if (cap && *cap)
        for (int i = 0; i < N_ORDER; i++)
            if (!strcmp(cap, g_order[i])) start = i;
    for (int i = start; i < N_ORDER; i++) {
        const dsp_cpu_ops *o = dsp_cpu_ops_get(g_order[i]);
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

/* AMX-INT8 (Sapphire Rapids and later): the CPU reports AMX-TILE and AMX-INT8 (cpuid 7.0 EDX bits
 * 24, 25) and Linux grants this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, once;
 * the grant is process-wide, so every pool thread may use the tiles). DSP_CPU_AMX=0 turns it off
 * (the panel matmuls then take their vector path: the same bits). */
static _Atomic int g_amx = -1;

static int amx_detect(void) {
    const char *e = getenv("DSP_CPU_AMX");
    if (e && !strcmp(e, "0")) return 0;
    if (!detect().avx512vnni || __get_cpuid_max(0, NULL) < 7) return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}

int dsp_cpu_amx_usable(void) {
    int v = g_amx;
    if (v < 0) g_amx = v = amx_detect(); /* idempotent */
    return v;
}

void dsp_cpu_amx_override(int on) { g_amx = on ? amx_detect() : 0; }
