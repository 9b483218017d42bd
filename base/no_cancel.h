/* lull never acts on a pthread_cancel(). A thread cancelled with deferred
 * cancellation (the default) unwinds at the next cancellation point it
 * reaches (write, open, read, close, nanosleep...: man 7 pthreads); glibc's
 * malloc reaches none, and neither may lull: inside it, the unwinding would
 * leave an arena's lock held or a protocol half done. Its slow paths that
 * make such calls (the messages, the small kernel files, the heap profile's
 * file) hold cancellation off around them; a cancellation that came
 * meanwhile stays pending, for the caller's next cancellation point.
 * Never on the fast path: the state is the thread's, but the call is not
 * free. */
#ifndef LULL_NO_CANCEL_H
#define LULL_NO_CANCEL_H

#include <pthread.h>

/* Cancellation off; returns the state to give lull_cancel_restore(). */
static inline int lull_cancel_off(void) {
    int old = PTHREAD_CANCEL_ENABLE;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    return old;
}

static inline void lull_cancel_restore(int old) {
    int ignored;
    pthread_setcancelstate(old, &ignored);
}

#endif
