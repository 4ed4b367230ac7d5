"""Environment knobs: a value that is not a number is one warning line, never a traceback at import."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_knob_that_is_not_a_number_warns_and_keeps_the_default(tmp_path):
    env = {**os.environ, "CACHEKIT_LOCAL_CACHE_BYTES": "1GB", "CACHEKIT_GRACE_SECONDS": "a day"}
    done = subprocess.run(
        [sys.executable, "-m", "cachekit.cli", "info", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert "CACHEKIT_LOCAL_CACHE_BYTES='1GB' is not a whole number" in done.stderr
    assert "CACHEKIT_GRACE_SECONDS='a day'" in done.stderr and lines[-1].startswith("error: ")
