/* Messages to stderr that never allocate: lull is the allocator, so it
 * cannot call anything that might call malloc while reporting. Formatting
 * goes into a stack buffer and out with one write(2). */
#ifndef LULL_MESSAGE_H
#define LULL_MESSAGE_H

#include <stdarg.h>
#include <stdbool.h>

/* "lull: <text>\n" on stderr. */
void lull_message(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "lull: <text>\n" on stderr, then abort(). */
void lull_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn, cold));
/* Only when LULL_CONF verbose=1 (lull_message_set_verbose). */
void lull_verbose(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void lull_message_set_verbose(bool on);

#endif
