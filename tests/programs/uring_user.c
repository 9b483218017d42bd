/* A program with an io_uring of its own, through the system's liburing
 * (liburing.so.2): it sets up a ring, submits a no-op, reaps it and prints
 * "OK". Under LD_PRELOAD=liblull.so its io_uring_* calls must still reach
 * that liburing, not the copy lull links in for its reclaim thread (whose
 * version, and so whose struct layouts, may differ from the program's). */
#include <liburing.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    struct io_uring ring;
    int r = io_uring_queue_init(4, &ring, 0);
    if (r < 0) {
        fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-r));
        return 1;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, 42);
    if ((r = io_uring_submit(&ring)) != 1) {
        fprintf(stderr, "io_uring_submit: %d\n", r);
        return 1;
    }
    struct io_uring_cqe *cqe;
    if ((r = io_uring_wait_cqe(&ring, &cqe)) < 0 || cqe->res != 0 || cqe->user_data != 42) {
        fprintf(stderr, "io_uring_wait_cqe: %d\n", r);
        return 1;
    }
    io_uring_cqe_seen(&ring, cqe);
    io_uring_queue_exit(&ring);
    printf("OK\n");
    return 0;
}
