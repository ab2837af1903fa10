/* core/quant: TEMPORARY minimal reference dequantization (F32/F16/BF16/Q8_0/Q4_0/Q4_1) so the
 * forward pass can be developed; replaced by the full implementation from the quant branch. */
#ifndef DSP_CORE_QUANT_H
#define DSP_CORE_QUANT_H

#include "core/dtype.h"
#include "core/status.h"

dsp_status dsp_dequantize_row(uint32_t type, const void *src, float *dst, uint64_t n);

#endif
