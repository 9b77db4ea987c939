"""The per-thread entry stack of _cpp/thread_entries.h, compiled from the installed header: made on
a thread's first use (a thread that never enters a guard allocates nothing), each thread's its own,
freed at thread exit with its spill block, and, when memory for it runs out, a stack with no
entries that refuses a push (the guard raises MemoryError) and is made on a later access."""

from helpers.native import compile_and_run

STACK_CHECK = r"""
#include "_cpp/thread_entries.h"
#include <atomic>
#include <cstdio>
#include <thread>

// The program's calloc and free stand in for the C library's (the header's calls bind to them),
// failing or recording the stack-sized blocks and passing everything else on.
extern "C" void *__libc_calloc(size_t, size_t);
extern "C" void *__libc_realloc(void *, size_t);
extern "C" void __libc_free(void *);
static std::atomic<int> fail_stacks{0};
static std::atomic<void *> made[16];
static std::atomic<int> n_made{0}, freed_made{0};
static std::atomic<void *> spill{nullptr};
static std::atomic<int> spill_freed{0};
extern "C" void *calloc(size_t n, size_t m) {
    if (n * m != sizeof(cyctx::Stack)) return __libc_calloc(n, m);
    if (fail_stacks.load()) return nullptr;
    void *p = __libc_calloc(n, m);
    made[n_made++].store(p);
    return p;
}
extern "C" void *realloc(void *p, size_t n) {
    void *q = __libc_realloc(p, n);
    if (n % sizeof(cyctx::Entry) == 0 && n >= cyctx::kInline * sizeof(cyctx::Entry)) spill.store(q);
    return q;
}
extern "C" void free(void *p) {
    if (p) {
        for (int i = 0; i < n_made.load(); i++)
            if (made[i].load() == p) freed_made++;
        if (p == spill.load()) spill_freed++;
    }
    __libc_free(p);
}

#define CHECK(c) do { if (!(c)) { std::printf("line %d: %s\n", __LINE__, #c); return 1; } } while (0)

static int deep_thread(unsigned long long token, int *ok) {
    cyctx_Switch sw = {nullptr, 0, 0}, out;
    std::size_t dropped = 0;
    *ok = 0;
    for (int i = 0; i < 20; i++)  // past kInline: the spill block
        if (cyctx::tls_push(token, nullptr, &sw) != 0) return 1;
    if (cyctx::tls_count(token) != 20) return 1;
    for (int i = 0; i < 10; i++)
        if (cyctx::tls_pop_own(token, &out, &dropped) != 0) return 1;
    *ok = 1;  // leaves 10 entries open: the thread's exit frees them all the same
    return 0;
}

int main() {
    cyctx_Switch sw = {nullptr, 0, 0}, out;
    std::size_t dropped = 0;

    // A thread that never touches the stack allocates nothing for it.
    std::thread([] {}).join();
    CHECK(n_made.load() == 0);

    // Out of memory at the first access: no entries, a push refused, nothing written.
    fail_stacks = 1;
    CHECK(cyctx::tls_depth() == 0 && cyctx::tls_count(5) == 0);
    CHECK(cyctx::tls_push(5, nullptr, &sw) == -1);
    CHECK(cyctx::tls_pop_own(5, &out, &dropped) == -1 && dropped == 0);
    CHECK(cyctx::tls_depth() == 0 && n_made.load() == 0);

    // Memory again: the stack is made on the next access and works.
    fail_stacks = 0;
    CHECK(cyctx::tls_push(5, nullptr, &sw) == 0 && cyctx::tls_depth() == 1 && n_made.load() == 1);

    // Another thread's stack is its own, and its exit frees it and its spill block.
    int ok = 0;
    std::thread t(deep_thread, 7ULL, &ok);
    t.join();
    CHECK(ok == 1 && n_made.load() == 2);
    CHECK(freed_made.load() == 1 && spill.load() != nullptr && spill_freed.load() == 1);
    CHECK(cyctx::tls_count(7) == 0 && cyctx::tls_count(5) == 1);
    CHECK(cyctx::tls_pop_own(5, &out, &dropped) == 0 && cyctx::tls_depth() == 0);
    std::puts("ok");
    return 0;
}
"""


def test_thread_stack_made_on_first_use_own_per_thread_freed_at_exit_and_out_of_memory(tmp_path):
    out = compile_and_run(tmp_path, STACK_CHECK, "stack")
    assert out.returncode == 0 and out.stdout.strip() == "ok", (
        f"exit {out.returncode}: {out.stdout}{out.stderr}"
    )
