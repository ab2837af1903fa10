/* core/status: status codes and the per-thread error message.
 *
 * Library code never exits and never prints errors itself: it returns a dsp_status and, for any
 * status other than DSP_OK, leaves a message naming the bad input in a thread-local buffer
 * (dsp_last_error). The message is set with dsp_error(), which returns the status so that a
 * failure site is one line:  return dsp_error(DSP_ERR_FORMAT, "tensor '%s': ...", name);
 * DSP_ASSERT is for programmer bugs only, never for bad input. */
#ifndef DSP_CORE_STATUS_H
#define DSP_CORE_STATUS_H

#include "dspark.h"

#ifdef __GNUC__
#define DSP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DSP_PRINTF(a, b)
#endif

/* Set the calling thread's error message and return st. */
dsp_status dsp_error(dsp_status st, const char *fmt, ...) DSP_PRINTF(2, 3);
/* Prefix the current message with "context: " (for adding the file name, the command, ...). */
void dsp_error_prefix(const char *fmt, ...) DSP_PRINTF(1, 2);
void dsp_error_clear(void);

void dsp_assert_fail(const char *expr, const char *file, int line);
#define DSP_ASSERT(x) ((x) ? (void)0 : dsp_assert_fail(#x, __FILE__, __LINE__))

#endif
