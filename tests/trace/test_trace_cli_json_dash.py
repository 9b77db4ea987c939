"""`cyctx trace --json -` is a usage error before the script runs: the script's own output
goes to stdout, which the JSON would be mixed into, and a file named '-' is what nobody who
types '-' means (it was written, silently)."""

import os
import subprocess
import sys


def test_json_dash_is_refused_before_the_script_and_writes_no_file(tmp_path):
    app = tmp_path / "app.py"
    app.write_text("print('the script ran')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CYCTX_TEST_DRIVER", "NO_COLOR")}
    got = subprocess.run(
        [sys.executable, "-m", "cyctx", "trace", "--simulate", "--json", "-", str(app)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert got.returncode == 2, got.stderr
    assert got.stdout == "", "the script did not start"
    assert "--json -: " in got.stderr and "stdout" in got.stderr and "usage:" in got.stderr
    assert not (tmp_path / "-").exists()
