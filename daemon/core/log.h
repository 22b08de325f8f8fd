/* Logging on stderr: one line per event, with a level. Thread-safe
 * (each line is one fprintf). The level comes from PE_LOG (error, warn,
 * info, debug) or pe_log_set_level.
 *
 * Format: "2026-11-25T19:12:50.816Z warn  message", or, when stderr is the
 * journal ($JOURNAL_STREAM names its device and inode, as systemd sets it
 * for a service), "<4>message": the sd-daemon priority prefix (3 error, 4
 * warn, 6 info, 7 debug) that journald files the line under, and no time
 * (the journal has it). Control characters in a message become '?', so an
 * event stays one line. A message longer than PE_LOG_MAX_LINE bytes is cut
 * there and ends with "... [N more bytes cut]". */
#ifndef PE_CORE_LOG_H
#define PE_CORE_LOG_H

#define PE_LOG_MAX_LINE 16384

typedef enum { PE_LOG_ERROR = 0, PE_LOG_WARN, PE_LOG_INFO, PE_LOG_DEBUG } pe_log_level;

void pe_log_set_level(pe_log_level lvl);
pe_log_level pe_log_get_level(void);
void pe_log(pe_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define PE_LOGE(...) pe_log(PE_LOG_ERROR, __VA_ARGS__)
#define PE_LOGW(...) pe_log(PE_LOG_WARN, __VA_ARGS__)
#define PE_LOGI(...) pe_log(PE_LOG_INFO, __VA_ARGS__)
#define PE_LOGD(...) pe_log(PE_LOG_DEBUG, __VA_ARGS__)

#endif
