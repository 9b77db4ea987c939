"""Python half of the ThreadSanitizer check (scripts/quality/tsan.sh runs it under libtsan).

16 threads on the simulated driver, released together from a barrier, for --seconds:

* all 16 first race for the first use of ContextGuard.shared(k), k = 0..3;
* 6 run the nogil enter()/exit() of shared(0) nested in itself and around an own guard of
  device 1, with switch_to()/switch_back() inside, checking what is current at every level;
* 2 run the nogil enter()/exit() of shared(2), and switch_to()/switch_back() to its handle,
  while 1 resets device 2's primary context (cuDevicePrimaryCtxReset) over and over: enter()
  detects each reset and re-activates the context (the close/re-activation gate);
* 4 run rounds on a fresh guard of device 3: 3 enter()/exit() it without the GIL while the 4th
  close()s it (close() against enter() and against re-activation);
* 1 constructs guards of device 1, enters them without the GIL and closes them;
* 1 constructs and frees guards (the live-guard registry), frees one while it is entered so
  that an enclosing nogil exit() drops its entry (the registry's read on the slow path), and
  runs Python's `with guard:`;
* 1 forks (a child checks that a guard refuses there: the fork flags) and reads the fork
  flags, while the others keep entering (every enter reads them).

Prints one summary line per workload and fails (exit 1) when a workload did not run or a
check failed. ThreadSanitizer's reports go where TSAN_OPTIONS's log_path says; tsan.sh counts
them. --seed-race runs only the deliberate race of tsan_harness.racy, which must be reported.
--trace runs it all under cyctx.trace() (the tracer's callback on every context call of the 16
threads, resource events under the simulator's lock), with the main thread collecting the
events while they are written (a small buffer, so that claims also meet a full one and
drop), and checks that events were recorded; the workloads' counts are the untraced run's to
check (under TSan the tracer slows them, unevenly).
"""

import argparse
import array
import os
import sys
import threading
import warnings

from cyctx.testing import use_simulated_driver

SIM = use_simulated_driver(device_count=4)

import tsan_harness as h  # noqa: E402

import cyctx  # noqa: E402
from cyctx import ContextGuard, CyctxError, ForkError  # noqa: E402
from cyctx._guard import fork_state, open_entries  # noqa: E402

THREADS = 16


def seed_race():
    threads = [threading.Thread(target=h.racy, args=(200_000, 2)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("seeded race ran: counter", h.racy(0, 0))


class Results:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.problems = []

    def add(self, key, n=1):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def problem(self, text):
        with self.lock:
            self.problems.append(text)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--seed-race", action="store_true")
    p.add_argument("--trace", action="store_true")
    args = p.parse_args()
    if args.seed_race:
        seed_race()
        return 0

    # Resets warn ContextResetWarning, the freed-while-entered guard ResourceWarning: both are
    # the behaviour under test here, not news.
    warnings.simplefilter("ignore")
    res = Results()
    deadline = [0.0]
    # The clock starts when all 16 are there (the action runs once, in one of them).
    start = threading.Barrier(
        THREADS, action=lambda: deadline.__setitem__(0, h.monotonic() + args.seconds), timeout=300
    )
    own1 = ContextGuard(1)  # an own (not shared) guard, entered by several threads at once
    # Each round of the close workload starts when its 4 threads are there: the barrier's
    # action (run once, in one of them) decides whether there is time for it and makes its guard.
    close_round = {}

    def next_close_round():
        go = h.monotonic() < deadline[0]
        close_round["guard"] = ContextGuard(3) if go else None

    round_barrier = threading.Barrier(4, action=next_close_round, timeout=300)

    def first_use():
        start.wait()
        for k in range(4):
            with ContextGuard.shared(k):  # its first use: the retain, raced
                pass
        ready.wait()

    def stable():
        rounds, bad = h.nested(ContextGuard.shared(0), own1, deadline[0])
        res.add("nested rounds", rounds)
        if bad:
            res.problem(f"nested: {bad} mismatches of the current context")

    def reset_victim():
        g = ContextGuard.shared(2)
        rounds = array.array("l", [0])
        while h.monotonic() < deadline[0]:
            try:
                h.under_resets(g, deadline[0], memoryview(rounds))
            except CyctxError:
                res.add("steps failed by a reset")
        res.add("rounds under resets", rounds[0])

    def resets():
        res.add("resets", h.resetter(2, deadline[0], 2000))

    def close_rounds(index):
        while True:
            round_barrier.wait()
            g = close_round["guard"]
            if g is None:
                return
            if index == 0:
                for _ in range(50):  # let the others get going
                    h.enter_nogil(g)
                    h.exit_nogil(g)
                while True:
                    try:
                        g.close()
                        break
                    except cyctx.GuardError:
                        pass  # busy: a re-activation in flight; try again
                res.add("guards closed under use")
            else:
                rounds = array.array("l", [0])
                try:
                    h.until_closed(g, deadline[0], memoryview(rounds))
                except cyctx.GuardError:
                    res.add("enters refused as closed")
                except CyctxError as exc:
                    res.add(f"enters failed: {type(exc).__name__}")
                res.add("rounds before a close", rounds[0])

    def registry():
        outer = ContextGuard.shared(0)
        while h.monotonic() < deadline[0]:
            g = ContextGuard(1)  # live_add
            with g:
                with outer:
                    pass
            h.enter_nogil(outer)
            try:
                h.enter_nogil(g)
                del g  # live_remove; its entry on this thread is dead now
            finally:
                h.exit_nogil(outer)  # drops the dead entry (live_has), warns ResourceWarning
            res.add("guards freed while entered")
            if open_entries():
                res.problem(f"registry: {open_entries()} entries left open")

    def forker():
        g = ContextGuard.shared(0)
        while h.monotonic() < deadline[0]:
            if fork_state() != (False, False):
                res.problem(f"parent: fork state {fork_state()}")
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    with g:
                        pass
                except ForkError:
                    code = 0 if fork_state() == (True, True) else 4
                except BaseException:
                    code = 5
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                res.problem(f"forked child: exit {os.waitstatus_to_exitcode(status)}")
            res.add("forks")
            for _ in range(200):
                fork_state()

    def own_guards():
        while h.monotonic() < deadline[0]:
            g = ContextGuard(1)  # device 1, which the nested workload enters meanwhile
            for _ in range(20):
                h.enter_nogil(g)
                h.exit_nogil(g)
            g.close()
            res.add("own guards closed")

    plan = (
        [stable] * 6
        + [reset_victim] * 2
        + [resets]
        + [lambda i=i: close_rounds(i) for i in range(4)]
        + [registry, forker, own_guards]
    )
    assert len(plan) == THREADS
    ready = threading.Barrier(THREADS, timeout=300)

    def thread(work):
        try:
            first_use()
            work()
            if cyctx.current_handle() != 0 or open_entries():
                res.problem(f"{getattr(work, '__name__', 'a thread')} left a context or an entry")
        except BaseException as exc:
            res.problem(f"{getattr(work, '__name__', 'a thread')}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=thread, args=(w,)) for w in plan]
    tr = None
    if args.trace:
        tr = cyctx.trace(capacity=1 << 12, python_frames=2, native_frames=4, quiet=True).start()
    for t in threads:
        t.start()
    collected = 0
    while tr is not None and any(t.is_alive() for t in threads):
        tr.collect()  # the consumer of the buffer, against its 16 writers
        collected += len(tr._raw)
        tr._forget()  # counted, not kept
        threading.Event().wait(0.01)
    for t in threads:
        t.join()
    if tr is not None:
        tr.stop()
        collected += len(tr.events)
        print(f"traced events: {collected}, dropped (buffer full): {tr.dropped}")
        if tr.reason or not collected:
            res.problem(f"the trace recorded nothing ({tr.reason})")
        for text in res.problems:
            print("PROBLEM:", text)
        return 1 if res.problems else 0

    h_most = h.most_inside()
    for key in sorted(res.counts):
        print(f"{key}: {res.counts[key]}")
    print(f"most threads inside nogil loops at once: {h_most}")
    shared2 = ContextGuard.shared(2)
    print(f"resets detected by shared(2): {shared2.resets}")
    own1.close()
    print("retains per device:", [SIM.retain_count(i) for i in range(4)])
    need = (
        "nested rounds",
        "rounds under resets",
        "resets",
        "guards closed under use",
        "guards freed while entered",
        "forks",
        "own guards closed",
    )
    for key in need:
        if not res.counts.get(key):
            res.problem(f"workload did not run: {key}")
    if shared2.resets == 0:
        res.problem("no reset was detected")
    if h_most < 2:
        res.problem("the nogil loops never ran at the same time")
    # The shared guards hold one retain each; nothing else may be left.
    if [SIM.retain_count(i) for i in range(4)] != [1, 1, 1, 1]:
        res.problem("retains leaked")
    for text in res.problems:
        print("PROBLEM:", text)
    return 1 if res.problems else 0


if __name__ == "__main__":
    sys.exit(main())
