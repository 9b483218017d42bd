// A C++ plugin that tests/cxx/plugin_host.c (a C program linked with
// liblull.so) dlopen()s with RTLD_LOCAL: libstdc++ arrives with it, after
// lull's weak references to it were bound (to nothing), and into a local
// scope. Its operator new is still lull's (the host's global scope comes
// first), and failure must still follow the standard: lull finds the
// runtime with dlopen(RTLD_NOLOAD).
#include "lull.h"

#include <cstdint>
#include <new>

namespace {
volatile std::size_t huge = SIZE_MAX / 4;
int calls;
void uninstalling_handler() {
    calls++;
    std::set_new_handler(nullptr);
}
} // namespace

// 0 when all is well, else the number of the check that failed.
extern "C" __attribute__((visibility("default"))) int plugin_check() {
    int *i = new int(1);
    bool owned = lull_owns(i);
    delete i;
    if (!owned) return 1;
    try {
        (void)::operator new(huge);
        return 2;
    } catch (const std::bad_alloc &) {
    }
    std::set_new_handler(uninstalling_handler);
    try {
        (void)::operator new(huge);
        return 3;
    } catch (const std::bad_alloc &) {
    }
    if (calls != 1) return 4;
    std::set_new_handler(uninstalling_handler);
    if (::operator new(huge, std::nothrow) != nullptr || calls != 2) return 5;
    return 0;
}
