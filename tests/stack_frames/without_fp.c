/* Frames without a frame pointer (this file is built with
 * -fomit-frame-pointer): see frames.h. */
#include "frames.h"

#include <string.h>

static volatile unsigned sink;

void frame_without_fp(const char *kinds, void *arg) {
    volatile int local = sink;
    frame_step(kinds, arg);
    sink = local + 1;
}

void frame_big_without_fp(const char *kinds, void *arg) {
    volatile char big[20000];
    big[sink & 1023] = 1;
    frame_step(kinds, arg);
    sink = big[(sink + 1) & 1023];
}

/* seven values live across the call: more than the callee-saved registers
 * other than rbp, so rbp holds one and is saved in the frame */
void frame_many_registers(const char *kinds, void *arg) {
    unsigned a = sink, b = sink * 3, c = sink ^ 5, d = sink + 7, e = sink * 11, f = sink - 13,
             g = sink * 17;
    frame_step(kinds, arg);
    sink = a + b * c + d * e + f * g + sink;
}

void frame_vla(const char *kinds, void *arg) {
    size_t n = 16 + (size_t)(sink & 7) * 100 + strlen(kinds);
    volatile char v[n];
    v[0] = 1;
    frame_step(kinds, arg);
    sink = v[0];
}

/* an over-aligned local and a VLA: gcc realigns the stack through a
 * register (DRAP) and gives the CFA and rbp by DWARF expressions */
void frame_realigned(const char *kinds, void *arg) {
    volatile char a[64] __attribute__((aligned(64)));
    volatile char v[strlen(kinds) + 16];
    a[0] = 1;
    v[0] = 2;
    frame_step(kinds, arg);
    sink = a[0] + v[0];
}
