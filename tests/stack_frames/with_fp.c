/* Frames with a frame pointer (this file is built with
 * -fno-omit-frame-pointer): see frames.h. */
#include "frames.h"

#include <alloca.h>
#include <string.h>

static volatile int sink;

void frame_with_fp(const char *kinds, void *arg) {
    volatile int local = sink;
    frame_step(kinds, arg);
    sink = local + 1;
}

void frame_alloca(const char *kinds, void *arg) {
    volatile char *p = alloca(32 + strlen(kinds) * 64);
    p[0] = 1;
    frame_step(kinds, arg);
    sink = p[0];
}
