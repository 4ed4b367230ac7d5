"""Fixtures that write real image trees (several formats, depths, orientations and bad files)."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from cachekit.tools.synthetic import synthetic_image

#: Files in the mixed tree that must be skipped, with a word their reason must contain.
BAD_FILES = {
    "cat/empty.jpg": "empty",
    "cat/truncated.jpg": "truncated",
    "cat/not_an_image.png": "decodable",
    "dog/dangling.jpg": "unreadable",
}


def _bgr(rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgb[..., ::-1])


def write_mixed_tree(root: Path) -> dict[str, np.ndarray]:
    """An ImageFolder tree of real files; returns the upright RGB content of EXIF-rotated files."""
    rng = np.random.default_rng(1234)
    (root / "cat").mkdir(parents=True)
    (root / "dog" / "sub").mkdir(parents=True)
    upright = {}
    cv2.imwrite(
        str(root / "cat" / "photo.jpg"), _bgr(synthetic_image(rng, 300, 400)), [cv2.IMWRITE_JPEG_QUALITY, 90]
    )
    cv2.imwrite(str(root / "cat" / "gray.png"), synthetic_image(rng, 260, 240)[..., 1])
    rgba = np.dstack([_bgr(synthetic_image(rng, 230, 310)), rng.integers(0, 256, (230, 310), np.uint8)])
    cv2.imwrite(str(root / "cat" / "alpha.png"), rgba)
    deep = synthetic_image(rng, 280, 250).astype(np.uint16) * 257 + rng.integers(
        0, 257, (280, 250, 3)
    ).astype(np.uint16)
    cv2.imwrite(str(root / "dog" / "deep16.png"), _bgr(deep))
    up = synthetic_image(rng, 240, 320)
    stored = np.ascontiguousarray(np.rot90(up))  # orientation 6 = rotate 90 degrees clockwise to display
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(stored).save(root / "dog" / "rotated.jpg", quality=95, exif=exif)
    upright["dog/rotated.jpg"] = up
    cv2.imwrite(str(root / "dog" / "Ünïcödé name.BMP"), _bgr(synthetic_image(rng, 256, 300)))
    cv2.imwrite(str(root / "dog" / "sub" / "scan.tiff"), _bgr(synthetic_image(rng, 500, 270)))
    cv2.imwrite(
        str(root / "dog" / "tiny.webp"), _bgr(synthetic_image(rng, 120, 150)), [cv2.IMWRITE_WEBP_QUALITY, 101]
    )
    # bad inputs
    (root / "cat" / "empty.jpg").write_bytes(b"")
    ok, buf = cv2.imencode(".jpg", _bgr(synthetic_image(rng, 300, 300)))
    (root / "cat" / "truncated.jpg").write_bytes(buf.tobytes()[: len(buf) // 2])
    (root / "cat" / "not_an_image.png").write_text("this is not a PNG")
    os.symlink(root / "does-not-exist.jpg", root / "dog" / "dangling.jpg")
    (root / "dog" / "notes.txt").write_text("ignored: not an image extension")
    return upright


GOOD_FILES = sorted(
    [
        "cat/alpha.png",
        "cat/gray.png",
        "cat/photo.jpg",
        "dog/deep16.png",
        "dog/rotated.jpg",
        "dog/sub/scan.tiff",
        "dog/tiny.webp",
        "dog/Ünïcödé name.BMP",
    ],
    key=lambda p: p.split("/"),
)


@pytest.fixture(scope="session")
def mixed_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixed") / "raw"
    for rel, upright in write_mixed_tree(root).items():
        np.save(root.parent / (rel.replace("/", "_") + ".upright.npy"), upright)
    return root


@pytest.fixture(scope="session")
def small_tree(tmp_path_factory) -> Path:
    """40 photo-like JPEGs in 4 classes: big enough for several shards and loaders."""
    from cachekit.tools.synthetic import make_synthetic_folder

    return make_synthetic_folder(
        tmp_path_factory.mktemp("small") / "raw", 40, classes=4, size=(96, 128), seed=7
    )


@pytest.fixture(scope="session")
def small_cache(small_tree, tmp_path_factory) -> Path:
    """The small tree in path order, 7 samples a shard: shards 0-1 hold class 0, and so on."""
    from cachekit import BuildConfig, build

    out = tmp_path_factory.mktemp("small_cache") / "cache"
    build(
        small_tree,
        out,
        BuildConfig(
            pipeline="classification-224", size=32, shard_size=7, order="sorted", workers=1, progress=False
        ),
    )
    return out


@pytest.fixture(scope="session")
def big_tree(tmp_path_factory) -> Path:
    """96 large JPEGs (1200x1600): slow enough to decode that a build can be killed part-way."""
    root = tmp_path_factory.mktemp("big") / "raw"
    rng = np.random.default_rng(5)
    blobs = []
    for _ in range(4):
        small = synthetic_image(rng, 300, 400)
        big = cv2.resize(small, (1600, 1200), interpolation=cv2.INTER_CUBIC)
        blobs.append(cv2.imencode(".jpg", big[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes())
    for i in range(96):
        folder = root / f"class_{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.jpg").write_bytes(blobs[i % 4])
    return root


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3-compatible server (moto's) on loopback; the environment points boto/s3fs at it."""
    s3fs = pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    mp = pytest.MonkeyPatch()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # credentials and endpoint come from the environment, as they would for a real bucket
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }.items():
        mp.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(anon=False)
    if not fs.exists("datasets"):
        fs.mkdir("datasets")
    yield endpoint
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()
    mp.undo()


#: The secret of ``s3_options``: no file, record or message may ever show it.
S3_SECRET = "S3CR3T-never-shown-7f3a9c"


@pytest.fixture
def s3_options(s3_endpoint, monkeypatch, tmp_path) -> dict:
    """Storage options that reach the loopback S3 server, with every ``AWS_*`` variable unset and
    ``~/.aws`` out of reach: only the options can get a request through (worker processes too)."""
    import s3fs

    from cachekit.store import remote

    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    s3fs.S3FileSystem.clear_instance_cache()
    remote._MADE.clear()  # no filesystem made earlier from the environment's credentials
    return {"endpoint_url": s3_endpoint, "key": "cachekit-test-key", "secret": S3_SECRET}


def storage_option_args(options: dict) -> list[str]:
    """``options`` as the command line's ``--storage-option KEY=VALUE`` pairs."""
    return [arg for key, value in options.items() for arg in ("--storage-option", f"{key}={value}")]


def holds_secret(fs, prefix: str, secret: str) -> list[str]:
    """The objects under ``prefix`` whose bytes contain ``secret``."""
    return [path for path in fs.find(prefix) if secret.encode() in fs.cat_file(path)]


#: The rows of a one-worker bench over a pt cache, as the chart names them (the make_loader row follows).
ONE_WORKER_ROW_LABELS = [
    "raw files, PIL, in-process",
    "raw files, PIL, 1 worker",
    "raw files, OpenCV, in-process",
    "raw files, OpenCV, 1 worker",
    "pt cache, in-process",
    "pt cache, 1 worker",
]


@pytest.fixture(scope="session")
def learnable_tree(tmp_path_factory) -> Path:
    """Four classes a tiny CNN tells apart (each tints its images towards one colour), 12 images each."""
    from cachekit.tools.synthetic import synthetic_image

    raw = tmp_path_factory.mktemp("learnable") / "raw"
    rng = np.random.default_rng(0)
    tints = [(1.0, 0.2, 0.2), (0.2, 1.0, 0.2), (0.2, 0.2, 1.0), (0.6, 0.6, 0.6)]
    for c, tint in enumerate(tints):
        (raw / f"c{c}").mkdir(parents=True)
        for i in range(12):
            h, w = 48 + 8 * (i % 3), 64 - 8 * (i % 2)  # sizes vary, as a photo folder's do
            img = (synthetic_image(rng, h, w) * np.array(tint)).astype(np.uint8)
            cv2.imwrite(str(raw / f"c{c}" / f"{i}.png"), img[..., ::-1])
    return raw


class ThrottledLink:
    """A stand-in for a slow shared link in front of the loopback S3 server: every ranged GET's
    bytes cross one link of ``bytes_per_s``, one response after another in the order they were
    served, plus ``latency_s``; ``carried(t)`` counts the bytes the link had delivered by time ``t``."""

    def __init__(self, bytes_per_s: float, latency_s: float = 0.0) -> None:
        import threading

        self.bytes_per_s, self.latency_s = bytes_per_s, latency_s
        self.lock = threading.Lock()
        self.free_at = 0.0
        self.log: list[tuple[float, str, int]] = []  # (delivered at, path, bytes)

    def carry(self, path: str, size: int) -> None:
        import time

        with self.lock:
            begin = max(time.monotonic(), self.free_at)
            self.free_at = begin + size / self.bytes_per_s
            done = self.free_at
            self.log.append((done, path, size))
        time.sleep(max(0.0, done - time.monotonic()) + self.latency_s)

    def carried(self, until: float) -> int:
        with self.lock:
            return sum(size for done, _, size in self.log if done <= until)


@pytest.fixture
def throttled_link(s3_endpoint, monkeypatch):
    """``make(bytes_per_s, latency_s)``: every s3fs ranged GET of this process goes over a ThrottledLink."""
    import s3fs

    original = s3fs.S3FileSystem.cat_file

    def make(bytes_per_s: float, latency_s: float = 0.0) -> ThrottledLink:
        link = ThrottledLink(bytes_per_s, latency_s)

        def cat_file(self, path, start=None, end=None, **kwargs):
            data = original(self, path, start=start, end=end, **kwargs)
            link.carry(path, len(data))
            return data

        monkeypatch.setattr(s3fs.S3FileSystem, "cat_file", cat_file)
        return link

    return make


@pytest.fixture(scope="session")
def mixed_s3_cache(s3_endpoint, tmp_path_factory) -> tuple[str, Path]:
    """96 samples in 12 class-mixed shards of 8 (the default shuffled build), on S3."""
    import s3fs

    from cachekit import BuildConfig, build
    from cachekit.tools.synthetic import make_synthetic_folder

    root = tmp_path_factory.mktemp("mixed_s3")
    raw = make_synthetic_folder(root / "raw", 96, classes=6, size=(40, 40), seed=11)
    build(raw, root / "cache", BuildConfig(size=40, shard_size=8, workers=1, progress=False))
    s3fs.S3FileSystem(anon=False).put(str(root / "cache") + "/", "datasets/mixed", recursive=True)
    return "s3://datasets/mixed", root / "cache"
