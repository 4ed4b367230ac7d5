"""Tar discovery of two checkouts on the same WebDataset tars: wall and CPU time, local (page cache
warm, and cold: each tar's pages dropped with ``posix_fadvise(DONTNEED)`` before a run) and on a
loopback S3 server (moto), with the bytes fetched through the fsspec files counted.

    python benchmarks/tar_discovery.py --tree before=/tmp/tar-before --tree after=. --rounds 3 --s3

Each run is a fresh process with its tree first on ``PYTHONPATH``, timing ``tar_source`` alone (the
import not counted); the trees' runs are interleaved, round by round, and the medians compared. The
tars (``--small`` and ``--big``: TARS,MEMBERS,BYTES, each image a JPEG with a ``.cls`` beside it)
are written once into ``--dir`` and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

_CHILD = r"""
import json, sys, time
pattern, url = sys.argv[1], sys.argv[2] == "1"
fetched = [0, 0]
if url:
    import s3fs.core
    fetch = s3fs.core.S3File._fetch_range
    def counted(self, start, end):
        data = fetch(self, start, end)
        fetched[0] += len(data)
        fetched[1] += 1
        return data
    s3fs.core.S3File._fetch_range = counted
import cachekit
from cachekit import SourceOptions
from cachekit.build.sources.webdataset import tar_source
wall, cpu = time.perf_counter(), time.process_time()
source = tar_source(pattern, SourceOptions(), None)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"wall": wall, "cpu": cpu, "samples": len(source.paths), "skipped": len(source.ignored),
                  "bytes": fetched[0], "gets": fetched[1], "code": cachekit.__file__}))
"""


def _jpegs(count: int, size: int) -> list[bytes]:
    """``count`` JPEGs of about ``size`` bytes each (noise over a gradient, so each one differs)."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    side = 32
    while True:
        image = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
        if len(cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 75])[1]) >= size:
            break
        side += 8
    out = []
    for _ in range(count):
        image = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
        out.append(cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 75])[1].tobytes())
    return out


def make(folder: Path, name: str, tars: int, members: int, size: int) -> list[Path]:
    """``tars`` tars of ``members`` JPEG + .cls pairs, written once (a stamp names their sizes)."""
    stamp = folder / f"{name}.done"
    paths = [folder / f"{name}-{t:03d}.tar" for t in range(tars)]
    spec = f"{tars},{members},{size}"
    if stamp.exists() and stamp.read_text() == spec and all(p.exists() for p in paths):
        return paths
    blobs = _jpegs(32, size)
    for t, path in enumerate(paths):
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(members):
                for ext, data in (("jpg", blobs[(t + i) % len(blobs)]), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{t:03d}{i:07d}.{ext}")
                    info.size, info.mtime = len(data), 1_700_000_000
                    tar.addfile(info, __import__("io").BytesIO(data))
    os.sync()
    stamp.write_text(spec)
    return paths


def drop(paths: list[Path]) -> None:
    """The tars' pages out of the page cache (only theirs)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(tree: str, pattern: str, url: bool, env: dict, cwd: Path) -> dict:
    env = env | {"PYTHONPATH": str(Path(tree).resolve())}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, pattern, "1" if url else "0"],
        env=env, cwd=cwd, capture_output=True, text=True, check=False,
    )  # fmt: skip (not run in a checkout: python -c puts the working folder first on the path)
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def s3_server(folder: Path, sets: dict[str, list[Path]], count: int) -> tuple[object, dict]:
    """A moto server on loopback holding the first ``count`` tars of each set; the environment for it."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    os.environ.update(env)
    import s3fs

    fs = s3fs.S3FileSystem(anon=False)
    fs.mkdir("tars")
    for name, paths in sets.items():
        for p in paths[:count]:
            fs.put_file(str(p), f"tars/{name}/{p.name}")
    return server, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout (two or more)")
    ap.add_argument("--dir", default="/tmp/tar-discovery-bench", help="where the tars are written")
    ap.add_argument("--small", default="8,10000,12000", help="TARS,MEMBERS,BYTES of small images")
    ap.add_argument("--big", default="8,500,250000", help="TARS,MEMBERS,BYTES of big images")
    ap.add_argument("--sets", default="small,big", help="which sets to discover (small, big or both)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-cold", action="store_true", help="skip the cold page cache runs")
    ap.add_argument("--s3", action="store_true", help="also discover the tars on a loopback S3 server")
    ap.add_argument("--s3-tars", type=int, default=8, help="tars of each set put on the S3 server")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    sets = {
        name: make(folder, name, *map(int, spec.split(",")))
        for name, spec in (("small", args.small), ("big", args.big))
        if name in args.sets.split(",")
    }
    for name, paths in sets.items():
        print(f"{name}: {len(paths)} tars, {sum(p.stat().st_size for p in paths) / 1e9:.2f} GB", flush=True)
    modes = [("warm", False)] + ([] if args.no_cold else [("cold", False)])
    env = dict(os.environ)
    server = None
    if args.s3:
        server, s3env = s3_server(folder, sets, args.s3_tars)
        env |= s3env
        modes.append(("s3", True))
    results: dict = {}
    for name, paths in sets.items():
        for mode, url in modes:
            pattern = f"s3://tars/{name}/*.tar" if url else str(folder / f"{name}-*.tar")
            if mode == "warm":
                for p in paths:
                    p.read_bytes()  # in the page cache before the first round
            for r in range(args.rounds):
                for tree_name, tree in trees.items():
                    if mode == "cold":
                        drop(paths)
                    got = run(tree, pattern, url, env, folder)
                    results.setdefault((name, mode, tree_name), []).append(got)
                    print(f"{name} {mode} round {r} {tree_name}: {json.dumps(got)}", flush=True)
    if server is not None:
        server.stop()
    print("\nset    mode  tree      wall s  cpu s   MB fetched  GETs  (medians)")
    for (name, mode, tree_name), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall", "cpu", "bytes", "gets")}
        print(
            f"{name:6} {mode:5} {tree_name:8} {med['wall']:7.2f} {med['cpu']:6.2f} "
            f"{med['bytes'] / 1e6:11.1f} {med['gets']:5.0f}"
        )
    names = list(trees)
    for name in sets:
        for mode, _ in modes:
            base = [r["wall"] for r in results[(name, mode, names[0])]]
            for other in names[1:]:
                runs = results[(name, mode, other)]
                ratio = statistics.median(r["wall"] for r in runs) / statistics.median(base)
                line = f"{name} {mode}: {other}/{names[0]} wall {ratio:.2f}x"
                cpu = statistics.median(r["cpu"] for r in runs) / statistics.median(
                    r["cpu"] for r in results[(name, mode, names[0])]
                )
                line += f", cpu {cpu:.2f}x"
                if mode == "s3":
                    b0 = statistics.median(r["bytes"] for r in results[(name, mode, names[0])])
                    line += f", bytes {statistics.median(r['bytes'] for r in runs) / max(b0, 1):.2f}x"
                print(line)


if __name__ == "__main__":
    main()
