/* A real server under LD_PRELOAD=liblull.so: Debian's redis-server driven
 * by redis-benchmark on 127.0.0.1 (bounded request counts), then a
 * FLUSHALL of what it stored. The server must answer every request, keep
 * its data consistent (a value written is read back), map liblull.so, and
 * exit cleanly on SHUTDOWN. Skipped only when redis is not installed. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int sh(const char *cmd, char *out, size_t len) {
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = out ? fread(out, 1, len - 1, f) : 0;
    if (out)
        out[n] = 0;
    else {
        char sink[4096];
        while (fread(sink, 1, sizeof sink, f) > 0) {
        }
    }
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(redis_preload, redis_server_serves_a_benchmark_under_lull, .timeout = 300) {
#if !defined(LULL_OVERRIDE) || defined(LULL_SANITIZED)
    cr_skip_test("needs the malloc-replacing liblull.so");
#endif
    if (sh("command -v redis-server && command -v redis-benchmark && command -v redis-cli", NULL,
           0) != 0)
        cr_skip_test("redis-server / redis-benchmark not installed");
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    int port = 20000 + rand() % 20000;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setenv("LD_PRELOAD", LULL_SO_PATH, 1);
        int null = open("/dev/null", 1);
        if (null >= 0) dup2(null, 1);
        execlp("redis-server", "redis-server", "--port", portstr, "--bind", "127.0.0.1", "--save",
               "", "--appendonly", "no", "--lazyfree-lazy-user-flush", "no", (char *)NULL);
        _exit(127);
    }
    char cmd[512], out[8192];
    int up = 0;
    for (int i = 0; i < 100 && !up; i++) {
        snprintf(cmd, sizeof cmd, "redis-cli -p %d ping 2>/dev/null", port);
        up = sh(cmd, out, sizeof out) == 0 && strstr(out, "PONG") != NULL;
        if (!up) usleep(100000);
    }
    if (!up) kill(pid, SIGKILL);
    cr_assert(up, "redis-server under lull did not answer PING on port %d", port);

    snprintf(cmd, sizeof cmd, "grep -c liblull /proc/%d/maps", (int)pid);
    sh(cmd, out, sizeof out);
    cr_assert_gt(atoi(out), 0, "redis-server did not map liblull.so");

    /* bounded load: 20k requests per test, 1 KiB values, 50 clients */
    snprintf(
        cmd, sizeof cmd,
        "redis-benchmark -p %d -n 20000 -c 50 -d 1024 -r 100000 -q -t set,get,lpush,lpop,sadd 2>&1",
        port);
    int rc = sh(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "redis-benchmark failed: %s", out);
    cr_assert(strstr(out, "SET") && strstr(out, "GET"), "redis-benchmark output: %s", out);

    snprintf(cmd, sizeof cmd,
             "redis-cli -p %d set lull-key the-value-lull-wrote >/dev/null && redis-cli -p %d get "
             "lull-key",
             port, port);
    sh(cmd, out, sizeof out);
    cr_assert(strstr(out, "the-value-lull-wrote"), "value not read back: %s", out);
    snprintf(cmd, sizeof cmd, "redis-cli -p %d dbsize", port);
    sh(cmd, out, sizeof out);
    cr_assert_gt(atoi(out), 1000, "redis kept only %s keys", out);

    snprintf(cmd, sizeof cmd, "redis-cli -p %d flushall sync", port);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "redis-cli -p %d dbsize", port);
    sh(cmd, out, sizeof out);
    cr_assert_eq(atoi(out), 0, "FLUSHALL left %s keys", out);

    snprintf(cmd, sizeof cmd, "redis-cli -p %d shutdown nosave 2>/dev/null", port);
    sh(cmd, NULL, 0);
    int st = 0;
    for (int i = 0; i < 100; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        usleep(100000);
        if (i == 99) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            cr_assert_fail("redis-server did not exit on SHUTDOWN");
        }
    }
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "redis-server exit status %d", st);
}
