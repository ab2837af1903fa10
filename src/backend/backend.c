/* backend/backend: choosing a backend (see backend.h). */
#include "backend/backend.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const char *dsp_backend_kind_name(dsp_backend_kind k) {
    switch (k) {
    case DSP_BACKEND_AUTO: return "auto";
    case DSP_BACKEND_CPU: return "cpu";
    case DSP_BACKEND_CUDA: return "cuda";
    }
    return "unknown";
}

#ifndef DSP_HAVE_CUDA
bool dsp_backend_cuda_available(void) { return false; }

dsp_status dsp_backend_cuda_create(const dsp_backend_params *p, dsp_backend **out) {
    (void)p;
    *out = NULL;
    return dsp_error(DSP_ERR_UNSUPPORTED, "this dspark was built without the CUDA backend (configure with -DDSPARK_CUDA=ON)");
}
#endif

dsp_backend_kind dsp_backend_auto_kind(void) {
    const char *d = getenv("DSPARK_DEVICE");
    if (d && !strcmp(d, "cpu")) return DSP_BACKEND_CPU;
    if (d && !strcmp(d, "cuda")) return DSP_BACKEND_CUDA;
    return dsp_backend_cuda_available() ? DSP_BACKEND_CUDA : DSP_BACKEND_CPU;
}

dsp_status dsp_backend_create(const dsp_backend_params *p, dsp_backend **out) {
    dsp_backend_params d = {.kind = DSP_BACKEND_AUTO};
    if (!p) p = &d;
    switch (p->kind) {
    case DSP_BACKEND_CPU: return dsp_backend_cpu_create(p, out);
    case DSP_BACKEND_CUDA: return dsp_backend_cuda_create(p, out);
    case DSP_BACKEND_AUTO: { /* the GPU when there is a usable one, else the CPU (dsp_backend_auto_kind) */
        dsp_backend_params q = *p;
        q.kind = dsp_backend_auto_kind();
        return dsp_backend_create(&q, out);
    }
    }
    *out = NULL;
    return dsp_error(DSP_ERR_INVALID_ARG, "unknown backend kind %d", (int)p->kind);
}

void dsp_backend_destroy(dsp_backend *be) {
    if (be) be->ops->destroy(be);
}
