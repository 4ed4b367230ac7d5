"""listing: a raw folder on object storage listed for a build, in time and peak memory.

listing  N objects in ImageFolder layout (1,000 a class folder) on a loopback S3 server (moto, in a
         process of its own, filled in memory, pages served from a sorted index of the keys as S3
         does: moto scans every key for each page), listed by ``discover`` (paged, compact arrays)
         and by the single ``fs.find(detail=True)`` it replaced; each in a fresh process, its peak
         RSS over the RSS it had before listing (``VmHWM``), and with tracemalloc the Python
         allocations' peak
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from registry import suite

_SERVER = r"""
import bisect, sys
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import S3Backend, s3_backends
from moto.server import ThreadedMotoServer

n, per = int(sys.argv[1]), int(sys.argv[2])
backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
backend.create_bucket("raw", "us-east-1")
for k in range(n):
    c = k // per
    backend.put_object("raw", f"imagenet/n{c:08d}/n{c:08d}_{k:08d}.JPEG", b"x")
names = sorted(backend.get_bucket("raw").keys.keys())

# moto scans and sorts every key of the bucket for each page (a page of 1M objects: seconds); S3
# reads its index. The bucket does not change here, so pages come from one sorted list of names.
def list_objects_v2(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys):
    prefix, out = prefix or "", []
    at = bisect.bisect_right(names, continuation_token or start_after or "")
    at = max(at, bisect.bisect_left(names, prefix))
    while at < len(names) and names[at].startswith(prefix) and len(out) < max_keys:
        rest = names[at][len(prefix):]
        if delimiter and delimiter in rest:
            folder = prefix + rest.split(delimiter, 1)[0] + delimiter
            out.append(folder)
            at = bisect.bisect_left(names, folder[:-1] + chr(ord(delimiter) + 1))
        else:
            out.append(bucket.keys[names[at]])
            at += 1
    more = at < len(names) and names[at].startswith(prefix)
    last = out[-1] if out else None
    token = (last if isinstance(last, str) else last.name) if more else None
    if isinstance(last, str) and more:
        token = last[:-1] + chr(ord(delimiter) + 1)  # past every key of that folder
    return out, more, token

S3Backend.list_objects_v2 = list_objects_v2
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(*server.get_host_and_port(), flush=True)
sys.stdin.read()
server.stop()
"""

_MEASURE = r"""
import json, sys, time, tracemalloc
import s3fs
from cachekit.build.sources import discover

way, traced = sys.argv[1], sys.argv[2] == "1"

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

before = status("VmRSS")
if traced:
    tracemalloc.start()
t0 = time.perf_counter()
if way == "paged":
    found = len(discover("s3://raw/imagenet"))
else:
    found = len(s3fs.S3FileSystem(anon=False).find("raw/imagenet", detail=True))
seconds = time.perf_counter() - t0
out = {"objects": found, "seconds": seconds, "peak_rss_over_start": status("VmHWM") - before}
if traced:
    out["python_peak"] = tracemalloc.get_traced_memory()[1]
print(json.dumps(out))
"""


def _measure(way: str, env: dict, traced: bool) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, way, "1" if traced else "0"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@suite
def listing(args, root):
    import os

    rows = []
    for n in args.listing_objects:
        t0 = time.perf_counter()
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(n), "1000"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            host, port = server.stdout.readline().split()
            print(f"{n:,} objects on the server in {time.perf_counter() - t0:.0f} s")
            env = {
                **os.environ,
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            }
            ways = ["paged"] + (["find"] if n <= args.listing_find_max else [])
            for way in ways:
                timed = _measure(way, env, traced=False)
                traced = _measure(way, env, traced=True)
                row = {"objects": n, "way": way, **timed, "python_peak": traced["python_peak"]}
                rows.append(row)
                print(
                    f"{n:,} objects, {'discover (paged)' if way == 'paged' else 'fs.find(detail=True)'}: "
                    f"{row['seconds']:.1f} s, peak RSS +{row['peak_rss_over_start'] / 1e6:.0f} MB, "
                    f"Python allocations' peak {row['python_peak'] / 1e6:.0f} MB "
                    f"({row['python_peak'] / n:.0f} bytes an object)"
                )
        finally:
            server.stdin.close()
            server.wait(60)
    return {"rows": rows}
