/* Frames of several kinds for tests/test_profile_stack.c, each in the file
 * that compiles it so: every one calls frame_step(kinds, arg) (the test's)
 * and does some work after it returns, so that it is neither inlined nor
 * a tail call. */
#ifndef TESTS_STACK_FRAMES_H
#define TESTS_STACK_FRAMES_H

#ifdef __cplusplus
extern "C" {
#endif

/* The test's: runs the frame kind named by kinds[0] with kinds + 1, or the
 * probe at the end of the string. */
void frame_step(const char *kinds, void *arg);

/* without_fp.c, built with -fomit-frame-pointer */
void frame_without_fp(const char *kinds, void *arg);
void frame_big_without_fp(const char *kinds, void *arg); /* 20 KB of locals */
void frame_many_registers(const char *kinds, void *arg); /* rbp one of them */
void frame_vla(const char *kinds, void *arg);            /* a CFA from rbp */
void frame_realigned(const char *kinds, void *arg);      /* a CFA by an expression */

/* with_fp.c, built with -fno-omit-frame-pointer */
void frame_with_fp(const char *kinds, void *arg);
void frame_alloca(const char *kinds, void *arg);

/* cxx_frame.cc: a C++ frame with a destructor and a handler (its FDE has
 * a personality and an LSDA) */
void frame_cxx(const char *kinds, void *arg);

#ifdef __cplusplus
}
#endif

#endif
