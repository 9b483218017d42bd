// lull's C++ operators (src/cxx_operators.c) seen from a C++ program linked
// with lull: tests/CMakeLists.txt builds this file twice, against liblull.so
// (cxx_operators_shared) and against liblull.a (cxx_operators_static), and
// tests/test_cxx_operators.c runs each check of both in a child of its own:
//
//   resolve shared|static  every operator the program calls is lull's, and
//                          is the one the dynamic linker gives others
//                          (libstdc++'s own calls) too
//   align                  each new form gives lull's memory, aligned, and
//                          each delete form frees it
//   nothrow_huge           the nothrow forms return nullptr for a request
//                          no block can have; throw_huge: the others throw
//                          std::bad_alloc
//   handler_uninstalls     a new_handler that uninstalls itself: called once,
//                          then bad_alloc (nullptr for the nothrow forms)
//   handler_throws         a new_handler that throws bad_alloc: the throwing
//                          forms pass it on, the nothrow forms return nullptr
//   handler_frees          under an address-space limit, a new_handler that
//                          frees a block: the retry succeeds
//   wrong_size[_array|_aligned]  a sized delete with the wrong size: lull
//                          aborts (prints "block <address>" on stderr first)
//
// A check prints "ok <check>" and exits 0; a failure prints "FAIL: ..." on
// stderr and exits 1.
#include "lull.h"

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <new>
#include <sys/resource.h>
#include <typeinfo>
#include <unistd.h>
#include <vector>

namespace {

[[noreturn]] void fail(const char *what, const void *p = nullptr, std::size_t n = 0) {
    std::fprintf(stderr, "FAIL: %s (%p, %zu)\n", what, p, n);
    std::fflush(stderr);
    _exit(1);
}

void expect(bool ok, const char *what, const void *p = nullptr, std::size_t n = 0) {
    if (!ok) fail(what, p, n);
}

// A request no block can have (over lull's 64 TiB): it fails at once, and
// the same way every time.
volatile std::size_t huge = SIZE_MAX / 4;

using std::align_val_t;
using std::nothrow_t;
using std::size_t;

struct op {
    const char *name;
    void *addr;
};

#define OP(type, name, fn)                                                                         \
    { name, reinterpret_cast<void *>(static_cast<type>(fn)) }
const op operators[] = {
    OP(void *(*)(size_t), "_Znwm", &::operator new),
    OP(void *(*)(size_t), "_Znam", &::operator new[]),
    OP(void *(*)(size_t, const nothrow_t &) noexcept, "_ZnwmRKSt9nothrow_t", &::operator new),
    OP(void *(*)(size_t, const nothrow_t &) noexcept, "_ZnamRKSt9nothrow_t", &::operator new[]),
    OP(void *(*)(size_t, align_val_t), "_ZnwmSt11align_val_t", &::operator new),
    OP(void *(*)(size_t, align_val_t), "_ZnamSt11align_val_t", &::operator new[]),
    OP(void *(*)(size_t, align_val_t, const nothrow_t &) noexcept,
       "_ZnwmSt11align_val_tRKSt9nothrow_t", &::operator new),
    OP(void *(*)(size_t, align_val_t, const nothrow_t &) noexcept,
       "_ZnamSt11align_val_tRKSt9nothrow_t", &::operator new[]),
    OP(void (*)(void *) noexcept, "_ZdlPv", &::operator delete),
    OP(void (*)(void *) noexcept, "_ZdaPv", &::operator delete[]),
    OP(void (*)(void *, size_t) noexcept, "_ZdlPvm", &::operator delete),
    OP(void (*)(void *, size_t) noexcept, "_ZdaPvm", &::operator delete[]),
    OP(void (*)(void *, align_val_t) noexcept, "_ZdlPvSt11align_val_t", &::operator delete),
    OP(void (*)(void *, align_val_t) noexcept, "_ZdaPvSt11align_val_t", &::operator delete[]),
    OP(void (*)(void *, size_t, align_val_t) noexcept, "_ZdlPvmSt11align_val_t",
       &::operator delete),
    OP(void (*)(void *, size_t, align_val_t) noexcept, "_ZdaPvmSt11align_val_t",
       &::operator delete[]),
    OP(void (*)(void *, const nothrow_t &) noexcept, "_ZdlPvRKSt9nothrow_t", &::operator delete),
    OP(void (*)(void *, const nothrow_t &) noexcept, "_ZdaPvRKSt9nothrow_t", &::operator delete[]),
    OP(void (*)(void *, align_val_t, const nothrow_t &) noexcept,
       "_ZdlPvSt11align_val_tRKSt9nothrow_t", &::operator delete),
    OP(void (*)(void *, align_val_t, const nothrow_t &) noexcept,
       "_ZdaPvSt11align_val_tRKSt9nothrow_t", &::operator delete[]),
};
#undef OP

// Linked with liblull.so, the operators are the library's; with liblull.a,
// the program's own (lull's object from the archive). Either way the name
// resolves to that same function for everyone (libstdc++'s internal calls
// go through the dynamic linker), and a block from it is lull's.
void resolve(const char *how) {
    bool shared = !std::strcmp(how, "shared");
    if (!shared && std::strcmp(how, "static")) fail("resolve: say shared or static");
    Dl_info self{};
    expect(dladdr(reinterpret_cast<void *>(&resolve), &self) != 0, "dladdr of the program");
    for (const op &o : operators) {
        Dl_info info{};
        if (!dladdr(o.addr, &info) || !info.dli_fname) fail(o.name, o.addr);
        const char *base = std::strrchr(info.dli_fname, '/');
        base = base ? base + 1 : info.dli_fname;
        if (shared && std::strncmp(base, "liblull.so", 10)) {
            std::fprintf(stderr, "FAIL: %s is in %s, not liblull.so\n", o.name, info.dli_fname);
            _exit(1);
        }
        if (!shared && info.dli_fbase != self.dli_fbase) {
            std::fprintf(stderr, "FAIL: %s is in %s, not the program\n", o.name, info.dli_fname);
            _exit(1);
        }
        if (dlsym(RTLD_DEFAULT, o.name) != o.addr) {
            std::fprintf(stderr, "FAIL: the dynamic linker resolves %s to %p, not %p\n", o.name,
                         dlsym(RTLD_DEFAULT, o.name), o.addr);
            _exit(1);
        }
    }
    int *i = new int(7);
    expect(lull_owns(i), "new int is not lull's", i);
    delete i;
    std::vector<std::uint64_t> v(1000, 3);
    expect(lull_owns(v.data()), "a vector's buffer is not lull's", v.data());
}

// ---- alignment --------------------------------------------------------------

void touch(void *p, size_t n, size_t align, const char *what) {
    expect(p != nullptr, what, p, n);
    expect(reinterpret_cast<std::uintptr_t>(p) % align == 0, what, p, align);
    expect(lull_owns(p), what, p, n);
    expect(lull_usable_size(p) >= n, what, p, n);
    std::memset(p, 0x5a, n);
}

void align() {
    const size_t sizes[] = {0, 1, 8, 24, 100, 1000, 5000, 70000, 3u << 20};
    const size_t aligns[] = {1, 8, 16, 32, 64, 256, 4096, 65536, 2u << 20};
    for (size_t n : sizes) {
        // plain forms: the default new alignment (16) for any size that can
        // hold a 16-aligned object
        size_t a = n >= 16 ? __STDCPP_DEFAULT_NEW_ALIGNMENT__ : 1;
        void *p = ::operator new(n);
        touch(p, n, a, "operator new");
        ::operator delete(p);
        p = ::operator new(n);
        touch(p, n, a, "operator new, sized delete");
        ::operator delete(p, n);
        p = ::operator new[](n);
        touch(p, n, a, "operator new[]");
        ::operator delete[](p);
        p = ::operator new[](n);
        touch(p, n, a, "operator new[], sized delete[]");
        ::operator delete[](p, n);
        p = ::operator new(n, std::nothrow);
        touch(p, n, a, "operator new(nothrow)");
        ::operator delete(p, std::nothrow);
        p = ::operator new[](n, std::nothrow);
        touch(p, n, a, "operator new[](nothrow)");
        ::operator delete[](p, std::nothrow);
        for (size_t al : aligns) {
            align_val_t at{al};
            p = ::operator new(n, at);
            touch(p, n, al, "operator new(align_val_t)");
            ::operator delete(p, at);
            p = ::operator new(n, at);
            touch(p, n, al, "operator new(align_val_t), sized delete");
            ::operator delete(p, n, at);
            p = ::operator new[](n, at);
            touch(p, n, al, "operator new[](align_val_t)");
            ::operator delete[](p, at);
            p = ::operator new[](n, at);
            touch(p, n, al, "operator new[](align_val_t), sized delete[]");
            ::operator delete[](p, n, at);
            p = ::operator new(n, at, std::nothrow);
            touch(p, n, al, "operator new(align_val_t, nothrow)");
            ::operator delete(p, at, std::nothrow);
            p = ::operator new[](n, at, std::nothrow);
            touch(p, n, al, "operator new[](align_val_t, nothrow)");
            ::operator delete[](p, at, std::nothrow);
        }
    }
    // the compiler's own calls: an over-aligned type, and an array with a
    // cookie (its sized delete[] passes the cookie too)
    struct alignas(256) line {
        unsigned char b[256];
    };
    struct counted {
        std::uint64_t v = 1;
        ~counted() { v = 0; }
    };
    for (int i = 0; i < 100; i++) {
        line *l = new line[1 + i % 7];
        touch(l, sizeof(line), 256, "new line[]");
        delete[] l;
        counted *c = new counted[1 + i];
        expect(lull_owns(reinterpret_cast<char *>(c) - sizeof(size_t)), "new counted[]", c);
        delete[] c;
    }
    ::operator delete(nullptr, 16);
    ::operator delete[](nullptr, 16, align_val_t{64});
}

// ---- failure ----------------------------------------------------------------

void nothrow_huge() {
    expect(::operator new(huge, std::nothrow) == nullptr, "new(nothrow)");
    expect(::operator new[](huge, std::nothrow) == nullptr, "new[](nothrow)");
    expect(::operator new (huge, align_val_t{64}, std::nothrow) == nullptr,
           "new(align_val_t, nothrow)");
    expect(::operator new[](huge, align_val_t{4096}, std::nothrow) == nullptr,
           "new[](align_val_t, nothrow)");
    expect(new (std::nothrow) char[huge] == nullptr, "new (nothrow) char[]");
    // not a power of two: no block has it
    expect(::operator new (64, align_val_t{48}, std::nothrow) == nullptr, "alignment 48");
}

// Runs `what` and says whether it threw exactly std::bad_alloc.
template <class F> bool throws_bad_alloc(F what) {
    try {
        void *p = what();
        std::fprintf(stderr, "no exception: %p\n", p);
        return false;
    } catch (const std::bad_alloc &e) {
        return typeid(e) == typeid(std::bad_alloc);
    }
}

void throw_huge() {
    expect(throws_bad_alloc([] { return ::operator new(huge); }), "new");
    expect(throws_bad_alloc([] { return ::operator new[](huge); }), "new[]");
    expect(throws_bad_alloc([] { return ::operator new (huge, align_val_t{64}); }),
           "new(align_val_t)");
    expect(throws_bad_alloc([] { return ::operator new[](huge, align_val_t{4096}); }),
           "new[](align_val_t)");
    expect(throws_bad_alloc([] { return static_cast<void *>(new char[huge]); }), "new char[]");
    expect(throws_bad_alloc([] { return ::operator new (64, align_val_t{48}); }), "alignment 48");
}

// The four throwing and the four nothrow forms, for a request that fails.
void *(*const throwing[])() = {
    [] { return ::operator new(huge); },
    [] { return ::operator new[](huge); },
    [] { return ::operator new (huge, align_val_t{64}); },
    [] { return ::operator new[](huge, align_val_t{64}); },
};
void *(*const nothrowing[])() = {
    [] { return ::operator new(huge, std::nothrow); },
    [] { return ::operator new[](huge, std::nothrow); },
    [] { return ::operator new (huge, align_val_t{64}, std::nothrow); },
    [] { return ::operator new[](huge, align_val_t{64}, std::nothrow); },
};

int handler_calls;

void uninstalling_handler() {
    handler_calls++;
    std::set_new_handler(nullptr);
}

void throwing_handler() {
    handler_calls++;
    throw std::bad_alloc();
}

void with_handler(std::new_handler h, const char *what) {
    for (auto f : throwing) {
        handler_calls = 0;
        std::set_new_handler(h);
        expect(throws_bad_alloc(f), what);
        expect(handler_calls == 1, what, nullptr, static_cast<size_t>(handler_calls));
    }
    for (auto f : nothrowing) {
        handler_calls = 0;
        std::set_new_handler(h);
        expect(f() == nullptr, what);
        expect(handler_calls == 1, what, nullptr, static_cast<size_t>(handler_calls));
    }
    std::set_new_handler(nullptr);
}

void handler_uninstalls() {
    with_handler(uninstalling_handler, "a handler that uninstalls itself");
}

void handler_throws() {
    with_handler(throwing_handler, "a handler that throws bad_alloc");
}

// Under an address-space limit, blocks of 32 MiB until none fits: a
// handler that frees one of them and uninstalls itself lets the retry
// succeed (lull keeps the freed mapping for reuse, or unmaps it).
constexpr size_t big = 32u << 20;
std::vector<void *> *reserve;

void freeing_handler() {
    handler_calls++;
    if (!reserve->empty()) {
        ::operator delete(reserve->back(), big);
        reserve->pop_back();
    }
    if (reserve->empty()) std::set_new_handler(nullptr);
}

size_t vm_bytes() {
    std::FILE *f = std::fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
        if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
        std::fclose(f);
    }
    return pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

void handler_frees() {
    reserve = new std::vector<void *>();
    reserve->reserve(64);
    size_t vm = vm_bytes();
    expect(vm != 0, "/proc/self/statm");
    struct rlimit lim = {vm + 8 * big, vm + 8 * big};
    expect(setrlimit(RLIMIT_AS, &lim) == 0, "setrlimit");
    for (void *p; reserve->size() < 64 && (p = ::operator new(big, std::nothrow));)
        reserve->push_back(p);
    expect(!reserve->empty() && reserve->size() < 64, "the blocks under the limit", nullptr,
           reserve->size());
    for (int nothrow = 0; nothrow < 2; nothrow++) {
        handler_calls = 0;
        std::set_new_handler(freeing_handler);
        void *p = nothrow ? ::operator new(big, std::nothrow) : ::operator new(big);
        expect(p != nullptr && lull_owns(p), "the retry after the handler", p);
        expect(handler_calls >= 1, "the handler was not called");
        std::set_new_handler(nullptr);
        reserve->push_back(p); // full again
        expect(::operator new(big, std::nothrow) == nullptr, "the limit holds");
    }
}

// ---- sized delete with the wrong size -----------------------------------------

// The classic: a derived object deleted through a base without a virtual
// destructor. The compiler's sized delete passes sizeof(base).
struct base {
    int x = 1;
};
struct derived : base {
    char tail[4000] = {};
};

void say_block(const void *p) {
    std::fprintf(stderr, "block %p\n", p);
    std::fflush(stderr);
}

void wrong_size() {
    base *b = new derived;
    say_block(b);
    delete b;
}

void wrong_size_array() {
    void *p = ::operator new[](1000);
    say_block(p);
    ::operator delete[](p, 16);
}

void wrong_size_aligned() {
    void *p = ::operator new (1000, align_val_t{64});
    say_block(p);
    ::operator delete (p, 10, align_val_t{64});
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s CHECK [ARG]\n", argv[0]);
        return 2;
    }
    const char *check = argv[1];
    struct {
        const char *name;
        void (*run)();
    } const checks[] = {
        {"align", align},
        {"nothrow_huge", nothrow_huge},
        {"throw_huge", throw_huge},
        {"handler_uninstalls", handler_uninstalls},
        {"handler_throws", handler_throws},
        {"handler_frees", handler_frees},
        {"wrong_size", wrong_size},
        {"wrong_size_array", wrong_size_array},
        {"wrong_size_aligned", wrong_size_aligned},
    };
    if (!std::strcmp(check, "resolve")) {
        resolve(argc > 2 ? argv[2] : "");
    } else {
        bool found = false;
        for (const auto &c : checks)
            if (!std::strcmp(check, c.name)) {
                c.run();
                found = true;
            }
        if (!found) fail("no such check");
    }
    std::printf("ok %s\n", check);
    return 0;
}
