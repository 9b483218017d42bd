// A C++ frame (see frames.h): a destructor to run and a handler, so that
// its FDE names a personality routine and an LSDA.
#include "frames.h"

static volatile int sink;

namespace {
struct Guard {
    ~Guard() { sink = sink + 1; }
};
} // namespace

extern "C" void frame_cxx(const char *kinds, void *arg) {
    Guard g;
    try {
        frame_step(kinds, arg);
    } catch (...) {
        sink = sink + 2;
        throw;
    }
}
