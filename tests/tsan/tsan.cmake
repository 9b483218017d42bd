# Settings of the ThreadSanitizer build (LULL_SANITIZE=thread), shared by the
# Criterion suite (tests/CMakeLists.txt) and the plain programs of tests/tsan/.

# halt_on_error: the first report ends the process with exitcode 66 (in a
#   Criterion test: the test's sandbox, which Criterion reports as crashed).
# die_after_fork=0: the fork tests' children start their own reclaim thread.
# second_deadlock_stack: lock-order reports show both stacks.
# atexit_sleep_ms=100: at exit TSan waits this long for the threads still
#   running (lull's reclaim thread, always) to race with the exit; the
#   default 1000 ms, paid by each of the ~220 Criterion tests' processes (and
#   by the processes some of them start), was about half of the stage's time.
#   100 ms still spans a reclaim tick (idle ticks are 100 ms apart).
# suppressions: tsan.supp, each entry with its reason.
set(LULL_TSAN_OPTIONS
  "TSAN_OPTIONS=halt_on_error=1:exitcode=66:die_after_fork=0:second_deadlock_stack=1:history_size=4:atexit_sleep_ms=100:suppressions=${CMAKE_CURRENT_LIST_DIR}/tsan.supp")

# ASLR off (setarch -R): lull places its segments 1 TiB below where the
# kernel maps, which with some random layouts is outside TSan's application
# range; TSan then rewrites the MAP_FIXED_NOREPLACE hint to 0 and the
# mapping fails (or, as root, lands at address 0 and TSan aborts).
find_program(LULL_SETARCH setarch)
if(LULL_SETARCH)
  set(LULL_TSAN_LAUNCH ${LULL_SETARCH} ${CMAKE_SYSTEM_PROCESSOR} -R)
endif()

# Criterion tests not built under TSan, each for the reason given (the
# release stage runs them):
# - test_preload_programs, test_redis_preload: LD_PRELOAD the malloc-replacing
#   liblull.so into uninstrumented programs; a sanitizer build's library is
#   neither (LULL_OVERRIDE=OFF), so every test of theirs skips itself;
# - test_numa_guest: boots a qemu guest whose program is built from numa/
#   without TSan; the TSan process only waits for qemu.
set(LULL_TSAN_SKIP test_preload_programs test_redis_preload test_numa_guest)
