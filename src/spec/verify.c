/* spec/verify: the lossless verifier (DRAFTERS.md §3); the body is in verify_impl.h. */
#include "spec/verify_impl.h"

dsp_status dsp_spec_verify(const float *logits, int32_t n_vocab, int32_t k, const int32_t *draft, const float *q, dsp_sample_history *h,
                           const dsp_sample_params *sp, dsp_rng *rng, dsp_sample_scratch *s, dsp_sample_dist *d, int32_t *out, int32_t *n_out) {
    return dsp_spec_verify_impl(logits, NULL, n_vocab, k, draft, q, h, sp, rng, s, d, DSP_SPEC_FAULT_NONE, out, n_out);
}

dsp_status dsp_spec_verify_argmax(const int32_t *argmax, int32_t n_vocab, int32_t k, const int32_t *draft, dsp_sample_history *h,
                                  const dsp_sample_params *sp, dsp_rng *rng, int32_t *out, int32_t *n_out) {
    if (!argmax) return dsp_error(DSP_ERR_INVALID_ARG, "verify: NULL argmax rows");
    return dsp_spec_verify_impl(NULL, argmax, n_vocab, k, draft, NULL, h, sp, rng, NULL, NULL, DSP_SPEC_FAULT_NONE, out, n_out);
}
