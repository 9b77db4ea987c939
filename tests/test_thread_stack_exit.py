"""Guard exits that run at thread exit, and a thread's first use out of memory.

A thread's C++ thread_locals are destroyed in the reverse order of their construction, and
pthread key destructors run after all of them: a per-thread RAII binding constructed before the
thread's first guard use, or another key's destructor (a library's per-thread cleanup that
leaves a guard, or releases a Python thread state whose frames do), must still find its entry,
and the stack must be freed all the same, never allocated again for a thread that is ending."""

from helpers.native import compile_and_run

LATE = r"""
#include "_cpp/thread_entries.h"
#include <atomic>
#include <cstdio>
#include <thread>
#include <pthread.h>

extern "C" void *__libc_calloc(size_t, size_t);
extern "C" void __libc_free(void *);
static std::atomic<int> n_made{0}, n_freed{0};
static std::atomic<void *> made[16];
extern "C" void *calloc(size_t n, size_t m) {
    void *p = __libc_calloc(n, m);
    if (n * m == sizeof(cyctx::Stack)) made[n_made++].store(p);
    return p;
}
extern "C" void free(void *p) {
    if (p) for (int i = 0; i < n_made.load(); i++) if (made[i].load() == p) n_freed++;
    __libc_free(p);
}

// A per-thread RAII binding made before the thread's first guard use (constructed lazily, entered
// later), whose destructor leaves the guard: it runs before any pthread key's destructor.
static std::atomic<int> late_pop{99}, key_pop{99};
struct Late {
    bool entered = false;
    ~Late() {
        if (!entered) return;
        cyctx_Switch out; std::size_t d = 0;
        late_pop = cyctx::tls_pop_own(42, &out, &d);
    }
};
static thread_local Late late;
static pthread_key_t key, key_after, key_twice;
static void key_dtor(void *) {  // a pthread key destructor: after every C++ thread_local's
    cyctx_Switch out; std::size_t d = 0;
    key_pop = cyctx::tls_pop_own(43, &out, &d);
}
// Keys made after cyctx's (which its first use made): their destructors run after its own in
// each round. One leaves a block still open when cyctx's destructor first ran; the other comes
// back a second round, after the stack was freed, and looks at it.
static std::atomic<int> after_pop{99}, twice_depth{99};
static void key_after_dtor(void *) {
    cyctx_Switch out; std::size_t d = 0;
    after_pop = cyctx::tls_pop_own(44, &out, &d);
}
static void key_twice_dtor(void *round) {
    if (round == (void *)1) {
        pthread_setspecific(key_twice, (void *)2);
        return;
    }
    twice_depth = (int)cyctx::tls_depth();
}

int main() {
    pthread_key_create(&key, key_dtor);
    cyctx_Switch sw = {nullptr, 0, 0}, out;
    std::size_t d = 0;
    cyctx::tls_push(1, nullptr, &sw);  // the first use in the process: cyctx's key is made
    cyctx::tls_pop_own(1, &out, &d);
    pthread_key_create(&key_after, key_after_dtor);
    pthread_key_create(&key_twice, key_twice_dtor);
    std::thread([] {
        (void)late.entered;            // the thread_local made first
        cyctx_Switch sw = {nullptr, 0, 0};
        cyctx::tls_push(44, nullptr, &sw);
        cyctx::tls_push(43, nullptr, &sw);
        cyctx::tls_push(42, nullptr, &sw);
        late.entered = true;
        pthread_setspecific(key, (void *)1);
        pthread_setspecific(key_after, (void *)1);
        pthread_setspecific(key_twice, (void *)1);
    }).join();
    std::printf("late=%d key=%d after=%d twice=%d made=%d freed=%d\n", late_pop.load(),
                key_pop.load(), after_pop.load(), twice_depth.load(), n_made.load() - 1,
                n_freed.load());
    return 0;
}
"""


def test_exits_in_later_thread_exit_destructors_find_their_entries_and_leak_nothing(tmp_path):
    out = compile_and_run(tmp_path, LATE, "late")
    assert out.returncode == 0, out.stderr
    # 0: each late exit found its entry, the one after cyctx's destructor first ran too; after
    # the free, the ending thread reads an empty stack; the thread's one stack was freed (made
    # and freed count the thread's alone: the main thread's stack lives on).
    assert out.stdout.strip() == "late=0 key=0 after=0 twice=0 made=1 freed=1", out.stdout


OOM = r"""
#include "_cpp/thread_entries.h"
#include <atomic>
#include <cstdio>
#include <thread>
extern "C" void *__libc_calloc(size_t, size_t);
static thread_local bool fail_all = false;
extern "C" void *calloc(size_t n, size_t m) { return fail_all ? nullptr : __libc_calloc(n, m); }
int main() {
    std::thread([] {
        fail_all = true;  // out of memory at this thread's first guard use
        cyctx_Switch sw = {nullptr, 0, 0};
        int r = cyctx::tls_push(5, nullptr, &sw);
        fail_all = false;
        std::printf("push under OOM: %d\n", r);
    }).join();
    std::puts("survived");
}
"""


def test_a_first_use_out_of_memory_refuses_the_push_instead_of_aborting(tmp_path):
    # docs/design.md: "A thread whose stack cannot be allocated reads a shared empty one, which
    # refuses a push (the enter raises MemoryError)": also when every allocation fails (a C++
    # thread_local destructor's registration would abort in glibc then).
    out = compile_and_run(tmp_path, OOM, "oom")
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr}"
    assert out.stdout.split() == ["push", "under", "OOM:", "-1", "survived"], out.stdout
