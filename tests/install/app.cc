// A C++ program built against an installed lull (tests/install/run.sh): its
// new and delete must be lull's (the library's, or liblull.a's in the
// program), also a sized delete and an aligned new. Exits 1 if not.
#include "lull.h"

#include <cstdint>
#include <cstdio>
#include <new>
#include <string>

struct alignas(64) line {
    char b[64];
};

int main() {
    int *i = new int(1);
    line *l = new line;
    std::string s(1000, 'x');
    bool ok = lull_owns(i) && lull_owns(l) && lull_owns(s.data()) &&
              reinterpret_cast<std::uintptr_t>(l) % 64 == 0;
    delete i;
    delete l;
    std::printf("C++ new and delete: %s\n", ok ? "ok" : "NOT lull's");
    return ok ? 0 : 1;
}
