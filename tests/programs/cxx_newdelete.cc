// C++ allocation paths to run under LD_PRELOAD=liblull.so: new/delete,
// new[]/delete[], sized delete, aligned new/delete (align_val_t 64 and
// 4096), nothrow new, bad_alloc, and std::vector / std::string / std::map
// churn across std::threads, with objects made on one thread and destroyed
// on another. Prints "OK <checksum>" (the same for every allocator) and
// exits 0; any mismatch prints "FAIL: ..." on stderr and exits 1.
//
// Built with -fsized-deallocation (the default from C++14 on in g++), and the
// sized and aligned operator delete forms are also called explicitly.
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

[[noreturn]] void fail(const char *what, const void *p = nullptr, std::size_t n = 0) {
    std::fprintf(stderr, "FAIL: %s (%p, %zu)\n", what, p, n);
    std::fflush(stderr);
    _exit(1);
}

void check_align(const void *p, std::size_t a, const char *what) {
    if (reinterpret_cast<std::uintptr_t>(p) % a != 0) fail(what, p, a);
}

void fill(unsigned char *p, std::size_t n, unsigned seed) {
    for (std::size_t i = 0; i < n; i++)
        p[i] = static_cast<unsigned char>(seed + i * 31 + (i >> 8));
}

void verify(const unsigned char *p, std::size_t n, unsigned seed, const char *what) {
    for (std::size_t i = 0; i < n; i++)
        if (p[i] != static_cast<unsigned char>(seed + i * 31 + (i >> 8))) fail(what, p, i);
}

struct alignas(64) Line {
    unsigned char b[64];
};
struct alignas(4096) Page {
    unsigned char b[4096];
};

struct Tracked {
    std::uint64_t v[5];
    explicit Tracked(std::uint64_t x) {
        for (int i = 0; i < 5; i++)
            v[i] = x * (i + 1);
    }
    ~Tracked() {
        for (int i = 0; i < 5; i++)
            if (v[i] != v[0] * (i + 1))
                fail("Tracked corrupted", this, static_cast<std::size_t>(i));
    }
};

void operators() {
    // Plain and array forms, with sized delete.
    for (unsigned i = 0; i < 2000; i++) {
        std::size_t n = 1 + (i * 7919u) % 20000;
        auto *p = static_cast<unsigned char *>(::operator new(n));
        fill(p, n, i);
        verify(p, n, i, "operator new");
        ::operator delete(p, n); // sized
        auto *a = new unsigned char[n];
        fill(a, n, i + 1);
        verify(a, n, i + 1, "new[]");
        delete[] a;
        auto *t = new Tracked(i);
        delete t; // sized delete of a class object with -fsized-deallocation
        auto *ta = new Tracked[3]{Tracked(i), Tracked(i + 1), Tracked(i + 2)};
        delete[] ta; // array cookie + sized delete[]
    }
    // Over-aligned types and explicit align_val_t.
    for (unsigned i = 0; i < 500; i++) {
        Line *l = new Line;
        check_align(l, 64, "new Line");
        std::memset(l->b, static_cast<int>(i), sizeof l->b);
        delete l;
        Page *pg = new Page;
        check_align(pg, 4096, "new Page");
        std::memset(pg->b, static_cast<int>(i), sizeof pg->b);
        delete pg;
        Line *la = new Line[1 + i % 17];
        check_align(la, 64, "new Line[]");
        delete[] la;
        Page *pa = new Page[1 + i % 5];
        check_align(pa, 4096, "new Page[]");
        delete[] pa;
        for (std::size_t al : {std::size_t(64), std::size_t(4096)}) {
            std::size_t n = 1 + (i * 131u) % 100000;
            void *p = ::operator new(n, std::align_val_t(al));
            check_align(p, al, "operator new(align_val_t)");
            fill(static_cast<unsigned char *>(p), n, i);
            verify(static_cast<unsigned char *>(p), n, i, "aligned new");
            if (i % 2)
                ::operator delete(p, n, std::align_val_t(al)); // sized + aligned
            else
                ::operator delete(p, std::align_val_t(al));
            void *q = ::operator new[](n, std::align_val_t(al));
            check_align(q, al, "operator new[](align_val_t)");
            ::operator delete[](q, n, std::align_val_t(al));
        }
    }
    // nothrow forms and failure.
    void *p = ::operator new(100, std::nothrow);
    if (!p) fail("nothrow new returned null");
    ::operator delete(p, std::nothrow);
    volatile std::size_t huge = SIZE_MAX / 4;
    if (::operator new(huge, std::nothrow) != nullptr) fail("nothrow new of SIZE_MAX/4 succeeded");
    bool thrown = false;
    try {
        void *r = ::operator new(huge);
        ::operator delete(r);
    } catch (const std::bad_alloc &) {
        thrown = true;
    }
    if (!thrown) fail("operator new(SIZE_MAX/4) did not throw bad_alloc");
}

// Containers built on one thread and destroyed on another.
std::mutex handoff_lock;
std::vector<std::unique_ptr<std::map<std::string, std::vector<std::uint64_t>>>> handoff;
std::atomic<std::uint64_t> checksum{0};

std::uint64_t consume(std::unique_ptr<std::map<std::string, std::vector<std::uint64_t>>> m) {
    std::uint64_t h = 0;
    for (const auto &kv : *m) {
        h = h * 1099511628211ull + std::hash<std::string>{}(kv.first) % 1000003;
        for (std::uint64_t v : kv.second)
            h += v;
        if (kv.second.size() != 1 + kv.first.size() % 13)
            fail("vector size", &kv, kv.second.size());
    }
    return h;
}

void churn(unsigned id, unsigned rounds) {
    std::uint64_t local = 0;
    for (unsigned r = 0; r < rounds; r++) {
        auto m = std::make_unique<std::map<std::string, std::vector<std::uint64_t>>>();
        for (unsigned k = 0; k < 40; k++) {
            std::string key = "key-" + std::to_string(id) + "-" + std::to_string(r) + "-" +
                              std::string(k * 11 % 97, static_cast<char>('a' + k % 26));
            std::vector<std::uint64_t> v;
            for (std::size_t j = 0; j < 1 + key.size() % 13; j++)
                v.push_back(r * 1000 + k * 10 + j);
            (*m)[key] = std::move(v);
        }
        std::string big(1000 + (r * 4099) % 200000, 'x');
        big += std::to_string(r);
        local += big.size();
        std::vector<std::string> strs;
        for (unsigned s = 0; s < 100; s++)
            strs.emplace_back(s * 37 % 300, static_cast<char>('A' + s % 26));
        strs.shrink_to_fit();
        for (const auto &s : strs)
            local += s.size();
        std::unique_ptr<std::map<std::string, std::vector<std::uint64_t>>> theirs;
        {
            std::lock_guard<std::mutex> g(handoff_lock);
            handoff.push_back(std::move(m));
            if (handoff.size() > 8) {
                theirs = std::move(handoff.front()); // most likely another thread's
                handoff.erase(handoff.begin());
            }
        }
        if (theirs) local += consume(std::move(theirs));
    }
    checksum += local;
}

} // namespace

int main(int argc, char **argv) {
    unsigned threads = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 4;
    unsigned rounds = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 400;
    operators();
    std::vector<std::thread> ts;
    for (unsigned i = 0; i < threads; i++)
        ts.emplace_back(churn, i, rounds);
    for (auto &t : ts)
        t.join();
    for (auto &m : handoff)
        checksum += consume(std::move(m));
    handoff.clear();
    // Threads that only allocate and others that only free, through vectors.
    std::vector<std::vector<std::string> *> made(threads, nullptr);
    std::vector<std::thread> makers;
    for (unsigned i = 0; i < threads; i++)
        makers.emplace_back([&made, i] {
            auto *v = new std::vector<std::string>();
            for (unsigned j = 0; j < 5000; j++)
                v->emplace_back(std::to_string(j * (i + 1)) + std::string(j % 50, 'q'));
            made[i] = v;
        });
    for (auto &t : makers)
        t.join();
    std::vector<std::thread> freers;
    for (unsigned i = 0; i < threads; i++)
        freers.emplace_back([&made, i] {
            std::uint64_t h = 0;
            for (const auto &s : *made[(i + 1) % made.size()])
                h += s.size();
            delete made[(i + 1) % made.size()];
            checksum += h;
        });
    for (auto &t : freers)
        t.join();
    std::printf("OK %016" PRIx64 "\n", checksum.load());
    return 0;
}
