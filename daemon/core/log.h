/* Logging on stderr: one line per event, with a level. Thread-safe
 * (each line is one fprintf). The level comes from PE_LOG (error, warn,
 * info, debug) or pe_log_set_level. */
#ifndef PE_CORE_LOG_H
#define PE_CORE_LOG_H

typedef enum { PE_LOG_ERROR = 0, PE_LOG_WARN, PE_LOG_INFO, PE_LOG_DEBUG } pe_log_level;

void pe_log_set_level(pe_log_level lvl);
pe_log_level pe_log_get_level(void);
void pe_log(pe_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define PE_LOGE(...) pe_log(PE_LOG_ERROR, __VA_ARGS__)
#define PE_LOGW(...) pe_log(PE_LOG_WARN, __VA_ARGS__)
#define PE_LOGI(...) pe_log(PE_LOG_INFO, __VA_ARGS__)
#define PE_LOGD(...) pe_log(PE_LOG_DEBUG, __VA_ARGS__)

#endif
