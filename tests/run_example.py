"""Run an example as ``__main__``; exit 3 if a gloo worker thread is still alive when Python is about to finalise.

    python tests/run_example.py EXAMPLE [ARGS...]

A gloo thread that outlives the script may free a work holding a Python object (a tensor, or the context
``backward()`` stashes) after finalisation began, and that aborts the process ("terminate called without an
active exception"), now and then, under load. Checked here, a group left alive fails every run, not 1 in 10.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
import time

TASKS = "/proc/self/task"


def _gloo_threads() -> list[str]:
    names = []
    for tid in os.listdir(TASKS):
        try:
            with open(f"{TASKS}/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return [name for name in names if "gloo" in name]


@atexit.register  # registered first, so it runs after the example's own exit handlers
def _no_gloo_thread_left() -> None:
    if not os.path.isdir(TASKS):  # not Linux: nothing to check
        return
    deadline = time.monotonic() + 5  # a joined thread may linger in /proc for a moment
    while (left := _gloo_threads()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        print(f"gloo threads still alive as Python exits: {left}", file=sys.stderr, flush=True)
        os._exit(3)


if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as ``python EXAMPLE`` would have it
    runpy.run_path(sys.argv[0], run_name="__main__")
