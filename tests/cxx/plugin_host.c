/* A C program linked with liblull.so (no C++ runtime at its start) that
 * loads tests/cxx/plugin.cc's module with RTLD_LOCAL and runs its check.
 * Prints "ok plugin" and exits 0, or says what failed and exits 1. */
#include "lull.h"

#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGIN.so\n", argv[0]);
        return 2;
    }
    if (!lull_version()) return 1; /* and liblull.so is needed */
    if (dlsym(RTLD_DEFAULT, "_ZSt15get_new_handlerv")) {
        fprintf(stderr, "FAIL: libstdc++ is loaded before the plugin\n");
        return 1;
    }
    void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!plugin) {
        fprintf(stderr, "FAIL: dlopen: %s\n", dlerror());
        return 1;
    }
    int (*check)(void) = (int (*)(void))dlsym(plugin, "plugin_check");
    if (!check) {
        fprintf(stderr, "FAIL: no plugin_check\n");
        return 1;
    }
    int failed = check();
    if (failed) {
        fprintf(stderr, "FAIL: plugin check %d\n", failed);
        return 1;
    }
    printf("ok plugin\n");
    return 0;
}
