"""How a loader's worker processes behave when things go wrong, beside torch's own DataLoader.

    python benchmarks/worker_behaviour.py CACHE            # every scenario, make_loader and DataLoader
    python benchmarks/worker_behaviour.py CACHE --only kill

Each scenario is a small training script run as a user would run it (``python script.py``, in a
session of its own so that every process it starts can be counted): no main guard, a worker that
dies, SIGTERM and SIGKILL of the training process, a worker stopped with SIGSTOP under
``timeout=5``, a user op that never returns under ``timeout=3``, and the time to the first batch.
Printed per scenario and loader: seconds to the line or exit that tells the user, the exit code,
and how many of the script's processes are still alive 10 s after the end (a kill, or the exit).
CACHE is any cache (``cachekit build`` of a small folder).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

#: The loaders compared: the script's ``LOADER(cache, op)`` line for each.
LOADERS = {
    "make_loader": textwrap.dedent(
        """
        def LOADER(cache, op=None, timeout=None):
            from cachekit import make_loader
            from cachekit.transforms import PixelOp
            kw = {} if timeout is None else {"timeout": timeout}
            augment = None if op is None else [PixelOp(op)]
            return make_loader(cache, 8, workers=WORKERS, augment=augment, **kw)
        """
    ),
    "DataLoader": textwrap.dedent(
        """
        def LOADER(cache, op=None, timeout=None):
            import numpy as np, torch
            from cachekit import CachedDataset
            ds = CachedDataset(cache, transform=None if op is None else (
                lambda x: torch.from_numpy(op(np.ascontiguousarray(x.permute(1, 2, 0).numpy()), None)).permute(2, 0, 1)))
            kw = {} if timeout is None else {"timeout": timeout}
            return torch.utils.data.DataLoader(ds, 8, shuffle=True, num_workers=WORKERS,
                                               persistent_workers=WORKERS > 0, **kw)
        """
    ),
}

HEAD = textwrap.dedent(
    """
    import os, sys, time
    CACHE = sys.argv[1]
    WORKERS = int(sys.argv[2])
    def say(*words):
        print(*words, flush=True)
    """
)

#: Scenario name -> (the script's body, run at module level with no main guard unless it says so,
#: what the harness does to it).
SCENARIOS = {
    "no guard": (
        """
        t = time.monotonic()
        loader = LOADER(CACHE)
        n = sum(len(x[0]) for x in loader)
        say("read", n, "samples in", round(time.monotonic() - t, 2), "s")
        """,
        "wait",
    ),
    "first batch": (
        """
        if __name__ == "__main__":
            t = time.monotonic()
            loader = LOADER(CACHE)
            next(iter(loader))
            say("first batch after", round(time.monotonic() - t, 2), "s")
        """,
        "wait",
    ),
    "dead worker": (
        """
        def die(image, rng):
            from torch.utils.data import get_worker_info
            if get_worker_info() is not None and get_worker_info().id == 1:
                os._exit(3)
            return image
        if __name__ == "__main__":
            for _ in LOADER(CACHE, die):
                pass
        """,
        "wait",
    ),
    "SIGTERM": (
        """
        def slow(image, rng):
            time.sleep(0.01)
            return image
        if __name__ == "__main__":
            while True:
                for _ in LOADER(CACHE, slow):
                    say("batch")
        """,
        signal.SIGTERM,
    ),
    "SIGKILL": (
        """
        def slow(image, rng):
            time.sleep(0.01)
            return image
        if __name__ == "__main__":
            while True:
                for _ in LOADER(CACHE, slow):
                    say("batch")
        """,
        signal.SIGKILL,
    ),
    "SIGSTOP a worker": (
        """
        if __name__ == "__main__":
            loader = LOADER(CACHE, None, timeout=5)
            it = iter(loader)
            next(it)
            say("stop", *sorted(p.pid for p in __import__("multiprocessing").active_children()))
            time.sleep(1.5)
            t = time.monotonic()
            try:
                for _ in it:
                    pass
                say("no timeout")
            except Exception as exc:
                say("raised after", round(time.monotonic() - t, 1), "s:", type(exc).__name__, str(exc)[:120])
        """,
        "stop",
    ),
    "stuck op": (
        """
        def stuck(image, rng):
            while True:
                time.sleep(1)
        if __name__ == "__main__":
            t = time.monotonic()
            try:
                next(iter(LOADER(CACHE, stuck, timeout=3)))
            except Exception as exc:
                say("raised after", round(time.monotonic() - t, 1), "s:", type(exc).__name__, str(exc)[:120])
            say("end of script")
        """,
        "wait",
    ),
}


def _alive(pgid: int) -> list[int]:
    """Processes of the process group ``pgid`` still alive (zombies not counted)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def _wait_for_line(log: Path, proc: subprocess.Popen, limit: float) -> str:
    """The script's first line of output (its first batch), or "" if it ends or ``limit`` passes first."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        text = log.read_text()
        if "\n" in text:
            return text.split("\n", 1)[0]
        time.sleep(0.05)
    return ""


def run(cache: str, loader: str, name: str, workers: int, limit: float) -> dict:
    """Run one scenario; returns what it said, when, its exit code and what was left.

    The script's output goes to a file, not a pipe, so that its end is its own exit, not the
    moment the last process holding the pipe (a worker left behind) lets go of it."""
    body, action = SCENARIOS[name]
    if name == "stuck op":
        workers = 0  # in this process: a worker process's stuck op is the dead-worker case
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "train.py"
        script.write_text(HEAD + LOADERS[loader] + textwrap.dedent(body))
        log = Path(folder) / "out.txt"
        start = time.monotonic()
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, str(script), cache, str(workers)],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        told = None
        if isinstance(action, signal.Signals):
            _wait_for_line(log, proc, limit)  # its first batch: then the signal
            told = time.monotonic()
            os.kill(proc.pid, action)
        elif action == "stop":
            line = _wait_for_line(log, proc, limit)
            pids = [int(p) for p in line.split()[1:]]
            if pids:
                os.kill(pids[-1], signal.SIGSTOP)
        try:
            proc.wait(timeout=limit)
            note = ""
        except subprocess.TimeoutExpired:
            note = f"(still running after {limit:g} s)"
        end = time.monotonic()
        time.sleep(10)
        left = _alive(proc.pid)
        for pid in left:  # leave nothing behind for the next scenario
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        lines = [line for line in log.read_text().splitlines() if line.strip()] + ([note] if note else [])
    return {
        "seconds": round(end - (told or start), 1),
        "exit": proc.returncode if not note else "-",
        "left after 10 s": len(left),
        "said": next((line for line in lines if line.startswith("raised")), lines[-1] if lines else "")[:160],
        "lines": len(lines),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache")
    parser.add_argument("--only", default="", help="scenarios whose names contain this")
    parser.add_argument("--loader", choices=sorted(LOADERS), action="append")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=float, default=90.0, help="seconds before a scenario is killed")
    args = parser.parse_args(argv)
    loaders = args.loader or list(LOADERS)
    print("| scenario | loader | seconds | exit | left after 10 s | last line (lines) |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for name in SCENARIOS:
        if args.only.lower() not in name.lower():
            continue
        for loader in loaders:
            r = run(str(Path(args.cache).resolve()), loader, name, args.workers, args.limit)
            said = r["said"].replace("|", "/")
            print(f"| {name} | {loader} | {r['seconds']} | {r['exit']} | {r['left after 10 s']} | {said} ({r['lines']}) |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
