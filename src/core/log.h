/* core/log: leveled logging to stderr. The level is process-wide: info by default, the environment
 * variable DSPARK_LOG=debug|info|warn|error|none, or dsp_log_set_level once at start-up. */
#ifndef DSP_CORE_LOG_H
#define DSP_CORE_LOG_H

#include "core/status.h"

typedef enum { DSP_LOG_DEBUG = 0, DSP_LOG_INFO = 1, DSP_LOG_WARN = 2, DSP_LOG_ERROR = 3, DSP_LOG_NONE = 4 } dsp_log_level;

void dsp_log_set_level(dsp_log_level level);
dsp_log_level dsp_log_get_level(void);
void dsp_log(dsp_log_level level, const char *fmt, ...) DSP_PRINTF(2, 3);

#define DSP_LOGD(...) dsp_log(DSP_LOG_DEBUG, __VA_ARGS__)
#define DSP_LOGI(...) dsp_log(DSP_LOG_INFO, __VA_ARGS__)
#define DSP_LOGW(...) dsp_log(DSP_LOG_WARN, __VA_ARGS__)
#define DSP_LOGE(...) dsp_log(DSP_LOG_ERROR, __VA_ARGS__)

#endif
