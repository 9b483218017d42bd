/* A library, loaded with dlopen, with a thread-local array larger than
 * lull's largest non-huge block: glibc gives each thread that touches it a
 * block of its own from malloc (dynamic TLS), and frees it with the
 * thread's stack (tests/test_reclaim_start_tls.c). */
#define BIG_TLS_BYTES ((unsigned long)20 << 20)

static __thread char big[BIG_TLS_BYTES];

char *big_tls_touch(void) {
    big[0] = 1;
    big[BIG_TLS_BYTES - 1] = 1;
    return big;
}
