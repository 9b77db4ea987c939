"""relaxed_capture() blocks open when the process forks are left quietly in the child, as a
guard's block is there (the child cannot use the driver: there is no mode of its to restore),
and the parent's blocks end as they would have."""

import json

from helpers.children import run_child


def test_blocks_open_at_a_fork_are_left_quietly_in_the_child():
    proc = run_child(
        """
        import json, os, cyctx
        from cyctx._capture import open_blocks
        r, w = os.pipe()
        pid = None
        try:
            with cyctx.relaxed_capture():
                with cyctx.relaxed_capture():
                    with cyctx.device(0):
                        pid = os.fork()
            outcome = "quiet"
        except BaseException as e:
            outcome = f"{type(e).__name__}: {e}"
        if pid == 0:
            try:
                with cyctx.relaxed_capture():
                    entered = "entered"
            except cyctx.ForkError as e:
                entered = "ForkError: " + str("fork" in str(e))
            os.write(w, json.dumps([outcome, open_blocks(), entered]).encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        child = json.loads(os.read(r, 65536))
        print(json.dumps({"child": child, "parent": [outcome, open_blocks()]}))
        """
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["child"] == ["quiet", 0, "ForkError: True"], out["child"]
    assert out["parent"] == ["quiet", 0], out["parent"]
