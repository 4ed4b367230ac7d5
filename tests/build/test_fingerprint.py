"""A cache never lies: reuse is keyed on every option, and any sequence of builds ends where a fresh one would."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from manifests import listed_manifest

from cachekit import BuildConfig, UsageError, build, read_manifest
from cachekit.cli import main
from cachekit.tools.synthetic import synthetic_image
from cachekit.tools.verify import verify

BASE = ["--size", "16", "--shard-size", "4", "--workers", "1", "--quiet"]

#: One option changed at a time, and the words the refusal must name.
CHANGES = [
    (["--size", "12"], "size 16 -> 12"),
    (["--store", "jpeg"], "store pixels -> jpeg"),
    (["--store", "jpeg", "--quality", "80"], "store pixels -> jpeg"),
    (["--seed", "3"], "seed 0 -> 3"),
    (["--pipeline", "letterbox-640"], "recipe classification-224 -> letterbox-640"),
    (["--format", "hdf5"], "format pt -> hdf5"),
    (["--fast-decode"], "fast-decode off -> on"),
    (["--augment", "2"], "augment 0 -> 2"),
    (["--order", "sorted"], "order shuffled -> sorted"),
    (["--max-pixels", "1000000"], "max-pixels"),
    (["--shard-size", "3"], "shard"),
]


@pytest.mark.parametrize("extra, words", CHANGES, ids=[" ".join(c[0]) for c in CHANGES])
def test_update_with_other_options_is_refused_naming_them(small_tree, tmp_path, extra, words):
    out = tmp_path / "c"
    args = ["build", str(small_tree), "--out", str(out), *BASE]
    assert CliRunner().invoke(main, args).exit_code == 0
    before = (out / "manifest.json").read_bytes()
    for flag in (["--update"], []):
        result = CliRunner().invoke(main, [*args, *extra, *flag])
        assert result.exit_code == 2 and words in result.output and "--overwrite" in result.output, (
            result.output
        )
        assert len(result.output.strip().splitlines()) == 1
    assert (out / "manifest.json").read_bytes() == before and verify(out).ok


def test_changed_inputs_ask_for_update(small_tree, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(small_tree, raw)
    out = tmp_path / "c"
    build(raw, out, BuildConfig(size=16, workers=1, progress=False))
    (raw / "class_000" / "img_0000000.jpg").unlink()
    with pytest.raises(UsageError, match=r"changed since .* \(40 then, 39 now\); pass --update"):
        build(raw, out, BuildConfig(size=16, workers=1, progress=False))
    assert build(raw, out, BuildConfig(size=16, update=True, workers=1, progress=False)).status == "updated"


def test_an_older_format_cache_needs_overwrite(small_tree, tmp_path):
    out = tmp_path / "c"
    build(small_tree, out, BuildConfig(size=16, workers=1, progress=False))
    m = listed_manifest(out)
    m["format_version"] = 2
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UsageError, match="older format.*--overwrite"):
        build(small_tree, out, BuildConfig(size=16, workers=1, progress=False))
    result = build(small_tree, out, BuildConfig(size=16, overwrite=True, grace=0, workers=1, progress=False))
    assert result.status == "built" and verify(out).ok


# -- every option that shapes a cache is in its fingerprint --------------------------------------

#: Each BuildConfig option that shapes what a cache holds: (what the first build sets, what the
#: second changes). Options that need another (a codec needs hdf5) set it in both.
SHAPING = {
    "format": ({}, {"format": "zarr"}),
    "pipeline": ({}, {"pipeline": "letterbox-640"}),
    "size": ({}, {"size": 12}),
    "shard_size": ({}, {"shard_size": 5}),
    "labels": ({}, {"labels": "LABELS"}),
    "fast_decode": ({}, {"fast_decode": True}),
    "augment": ({}, {"augment": 2}),
    "seed": ({}, {"seed": 5}),
    "augment_rotate": ({"augment": 2}, {"augment": 2, "augment_rotate": 10.0}),
    "compression": ({"format": "hdf5"}, {"format": "hdf5", "compression": "gzip"}),
    "store": ({}, {"store": "png"}),
    "quality": ({"store": "jpeg"}, {"store": "jpeg", "quality": 70}),
    "order": ({}, {"order": "sorted"}),
    "shards": ({}, {"shards": 3}),
    "max_pixels": ({}, {"max_pixels": 1_000_000}),
    "annotations": ({}, {"annotations": "COCO"}),
    "masks": ({}, {"masks": "MASKS"}),
    "mask_classes": ({"masks": "MASKS"}, {"masks": "MASKS", "mask_classes": "MASK_CLASSES"}),
    "classes": ({}, {"classes": "CLASSES"}),
    "min_visibility": ({"annotations": "COCO"}, {"annotations": "COCO", "min_visibility": 0.5}),
    "arrays": ({}, {"arrays": "ARRAYS"}),
}
#: Options that change how a build runs, never what it writes.
NOT_SHAPING = {
    "workers", "strict", "overwrite", "update", "grace", "executor", "executor_options", "progress",
    "storage_options",
    "source",  # Python datasets', Parquet's and tars' options: in their inputs' identity (test_sources.py)
    "split",  # which splits are built: each split's cache is the same whichever others are
}  # fmt: skip


def test_every_build_option_is_known_to_shape_the_cache_or_not():
    from dataclasses import fields

    names = {f.name for f in fields(BuildConfig)}
    assert names == set(SHAPING) | NOT_SHAPING, "a new BuildConfig option: add it to SHAPING or NOT_SHAPING"


def _coco(raw: Path, rows: list[str], tmp: Path) -> Path:
    """COCO instances for ``rows``: one box a quarter of each image, centred, of one category."""
    images, annotations = [], []
    for i, rel in enumerate(rows):
        h, w = cv2.imread(str(raw / rel)).shape[:2]
        images.append({"id": i, "file_name": rel, "width": w, "height": h})
        annotations.append(
            {"id": i, "image_id": i, "category_id": 1, "bbox": [w / 4, h / 4, w / 2, h / 2], "iscrowd": 0}
        )
    path = tmp / "coco.json"
    path.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "x"}]})
    )
    return path


def _arrays(rows: list[str], tmp: Path) -> Path:
    """An array per input: three numbers."""
    for i, rel in enumerate(rows):
        (tmp / "emb" / rel).parent.mkdir(parents=True, exist_ok=True)
        np.save(str(tmp / "emb" / rel).rsplit(".", 1)[0] + ".npy", np.full(3, i, np.float32))
    return tmp / "emb"


def _masks(raw: Path, rows: list[str], tmp: Path) -> Path:
    """A class map per input: its left half class 1."""
    for rel in rows:
        h, w = cv2.imread(str(raw / rel)).shape[:2]
        mask = np.zeros((h, w), np.uint8)
        mask[:, : w // 2] = 1
        (tmp / "masks" / rel).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(tmp / "masks" / rel).rsplit(".", 1)[0] + ".png", mask)
    return tmp / "masks"


@pytest.mark.slow
@pytest.mark.parametrize("option", sorted(SHAPING))
def test_every_option_that_shapes_a_cache_changes_its_fingerprint(option, small_tree, tmp_path):
    """Changed alone, each option is refused without --overwrite, and with it gives a new cache:
    never "up to date" on the old bytes, and byte for byte what a fresh build with it writes."""
    labels = tmp_path / "labels.csv"
    rows = sorted(p.relative_to(small_tree).as_posix() for p in small_tree.rglob("*.jpg"))
    labels.write_text("".join(f"{r},{'odd' if i % 2 else 'even'}\n" for i, r in enumerate(rows)))
    files = {"LABELS": str(labels), "COCO": str(_coco(small_tree, rows, tmp_path)),
             "MASKS": str(_masks(small_tree, rows, tmp_path)),
             "ARRAYS": {"emb": str(_arrays(rows, tmp_path))}}  # fmt: skip
    (tmp_path / "classes.txt").write_text("class_003\nclass_001\nclass_000\nclass_002\n")
    (tmp_path / "mask-classes.txt").write_text("background\nleft\n")
    files |= {"CLASSES": str(tmp_path / "classes.txt"), "MASK_CLASSES": str(tmp_path / "mask-classes.txt")}
    first, second = (
        {k: files.get(v, v) if isinstance(v, str) else v for k, v in d.items()} for d in SHAPING[option]
    )
    common = {"size": 16, "shard_size": 8, "workers": 1, "progress": False}
    out = tmp_path / "cache"
    before = build(small_tree, out, BuildConfig(**{**common, **first})).manifest
    with pytest.raises(UsageError, match="--overwrite"):
        build(small_tree, out, BuildConfig(**{**common, **second}))
    result = build(small_tree, out, BuildConfig(**{**common, **second}, overwrite=True, grace=0))
    assert result.status == "built" and result.manifest.fingerprint != before.fingerprint
    fresh = build(small_tree, tmp_path / "fresh", BuildConfig(**{**common, **second})).manifest
    assert fresh.fingerprint == result.manifest.fingerprint
    assert [s.sha256 for s in fresh.shards] == [s.sha256 for s in result.manifest.shards]


# -- the invariant, over random sequences ------------------------------------------------------------

#: Options a step may pick: each changes the shard bytes.
OPTION_SPACE = {
    "size": [8, 12],
    "format": ["pt", "hdf5"],
    "store": ["pixels", "png"],
    "seed": [0, 1],
    "order": ["shuffled", "sorted"],
    "augment": [0, 2],
}
FILES = [f"{c}/img{i}.jpg" for c in ("a", "b") for i in range(4)]


def _image(name: str, version: int) -> bytes:
    rng = np.random.default_rng([sum(name.encode()), version])
    return cv2.imencode(".jpg", synthetic_image(rng, 14 + version, 18))[1].tobytes()


_PLAIN = {k: v[0] for k, v in OPTION_SPACE.items()}
options = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in OPTION_SPACE.items()})
steps = st.lists(
    st.one_of(
        st.tuples(st.just("build"), options, st.sampled_from(["", "update", "overwrite"])),
        st.tuples(st.sampled_from(["add", "remove", "modify"]), st.sampled_from(FILES), st.none()),
    ),
    min_size=2,
    max_size=6,
)


def _bytes_options(options: dict) -> dict:
    """The options the cache's bytes depend on: the seed only matters to a shuffled or augmented cache."""
    if options["order"] == "sorted" and not options["augment"]:
        return {k: v for k, v in options.items() if k != "seed"}
    return options


def _referenced(out: Path) -> dict[str, bytes]:
    m = read_manifest(out)
    found = {}
    for s in m.shards:
        path = out / s.file
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        found.update({str(f.relative_to(out)): f.read_bytes() for f in files if f.is_file()})
    return found


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=steps)
@example(  # a file removed and written again with the same bytes: a new mtime, a changed input
    sequence=[
        ("build", _PLAIN, ""),
        ("remove", FILES[0], None),
        ("add", FILES[0], None),
        ("build", _PLAIN, ""),
    ]
)
def test_any_sequence_of_builds_and_updates_ends_byte_identical_to_a_fresh_build(sequence):
    with tempfile.TemporaryDirectory() as tmp:
        raw, out = Path(tmp) / "raw", Path(tmp) / "cache"
        # each file's (content version, write stamp): a file removed and written again with the
        # same bytes has a new mtime, so it is a changed input (the build rightly asks for --update)
        stamps = iter(range(1, 10**6))
        present = {name: (0, next(stamps)) for name in FILES[:5]}
        for name, (version, stamp) in present.items():
            (raw / name).parent.mkdir(parents=True, exist_ok=True)
            (raw / name).write_bytes(_image(name, version))
            os.utime(raw / name, ns=(10**18 + stamp, 10**18 + stamp))
        built = None  # (options, the inputs they were built from) of the cache in `out`
        for kind, arg, flag in sequence:
            if kind != "build":
                path = raw / arg
                if kind == "remove" and arg in present and len(present) > 1:
                    path.unlink()
                    del present[arg]
                elif kind in ("add", "modify"):
                    version = present[arg][0] + 1 if arg in present else 0
                    present[arg] = (version, next(stamps))
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(_image(arg, version))
                    os.utime(path, ns=(10**18 + present[arg][1],) * 2)
                continue
            config = BuildConfig(
                **arg,
                shard_size=2,
                workers=1,
                progress=False,
                grace=3600,
                update=flag == "update",
                overwrite=flag == "overwrite",
            )
            before = (out / "manifest.json").read_bytes() if built else None
            state = dict(present)
            should_refuse = (
                built is not None
                and flag != "overwrite"
                and (
                    _bytes_options(built[0]) != _bytes_options(arg)
                    or (built[1] != state and flag != "update")
                )
            )
            try:
                build(raw, out, config)
            except UsageError:
                assert should_refuse, (arg, flag, built)
                assert (out / "manifest.json").read_bytes() == before and verify(out).ok
                continue
            assert not should_refuse, (arg, flag, built)
            built = (arg, state)
            m = read_manifest(out)
            # the invariant: byte for byte a fresh build with the final options and the recorded layout
            fresh = Path(tmp) / f"fresh-{len(os.listdir(tmp))}"
            layout = {"shards": m.order["shards"]} if m.order["kind"] == "shuffled" else {}
            build(raw, fresh, BuildConfig(**arg, shard_size=2, workers=1, progress=False, **layout))
            assert read_manifest(fresh).to_json() | {"created": ""} == m.to_json() | {"created": ""}
            assert _referenced(fresh) == _referenced(out)
            # and nothing else in the folder but what the cache records
            retired = (
                json.loads((out / ".cachekit-retired.json").read_text())["files"]
                if (out / ".cachekit-retired.json").exists()
                else {}
            )
            names = {p.name for p in out.iterdir()}
            index = json.loads((out / "manifest.json").read_text()).get("index")  # format 5's index file
            assert names == {"manifest.json", *(s.file for s in m.shards), *retired} | (
                {index["file"]} if index else set()
            ) | ({".cachekit-retired.json"} if retired else set())


def test_max_pixels_changes_the_fingerprint_and_every_shard_name(small_tree, tmp_path):
    """Fast: the limit on inputs decides which inputs a cache holds, so it is in the fingerprint
    and in every shard's name (a shard of another limit is never reused as this one)."""
    out = tmp_path / "c"
    quiet = {"size": 16, "shard_size": 4, "workers": 1, "progress": False}
    first = build(small_tree, out, BuildConfig(**quiet)).manifest
    second = build(small_tree, out, BuildConfig(max_pixels=1_000_000, overwrite=True, **quiet)).manifest
    assert second.fingerprint != first.fingerprint
    assert not {s.file for s in first.shards} & {s.file for s in second.shards}
    again = build(small_tree, out, BuildConfig(max_pixels=1_000_000, **quiet)).manifest  # up to date
    assert again.fingerprint == second.fingerprint
