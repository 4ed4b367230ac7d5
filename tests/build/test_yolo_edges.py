"""A YOLO dataset's data.yaml and class indices at their limits: one line or a reported row, never a
traceback, never a silent guess."""

from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner

from cachekit import BuildConfig, UsageError, build
from cachekit.build.sources.yolo import MAX_UNNAMED_CLASSES
from cachekit.cli import main
from cachekit.tools.synthetic_objects import make_object_dataset, object_classes

QUIET = {"workers": 1, "progress": False}


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return make_object_dataset(tmp_path_factory.mktemp("yolo") / "raw", 6, size=(40, 60), classes=3)


@pytest.fixture
def raw(objects, tmp_path):
    shutil.copytree(objects, tmp_path / "raw")
    return tmp_path / "raw"


def test_a_data_yaml_nested_50000_deep_is_one_line(raw, tmp_path):
    (raw / "data.yaml").write_text("names: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(UsageError, match="nested too deep"):
        build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    result = CliRunner().invoke(
        main, ["build", str(raw), "--out", str(tmp_path / "d"), "--annotations", "yolo"]
    )
    assert result.exit_code == 2 and "nested too deep" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_data_yaml_that_is_a_fifo_is_named_never_skipped(raw, tmp_path):
    (raw / "data.yaml").unlink()
    os.mkfifo(raw / "data.yaml")  # would block a reader: named as a file that cannot be read
    with pytest.raises(UsageError, match="data.yaml .* is not a regular file"):
        build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))


def test_without_a_data_yaml_a_class_past_the_limit_is_a_reported_row(raw, tmp_path):
    (raw / "data.yaml").unlink()
    label = raw / "labels" / "img_00003.txt"
    label.write_text(
        label.read_text() + "1000000 0.5 0.5 0.2 0.2\n" + f"{MAX_UNNAMED_CLASSES} 0.5 0.5 0.2 0.2\n"
    )
    m = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET)).manifest
    assert len(m.classes) == 3
    reasons = [d["reason"] for d in m.source["dropped"]]
    assert sum("without a data.yaml naming the classes" in r for r in reasons) == 2, reasons
    label.write_text(label.read_text() + f"{MAX_UNNAMED_CLASSES - 1} 0.5 0.5 0.2 0.2\n")  # at the limit: kept
    m = build(raw, tmp_path / "d", BuildConfig(annotations="yolo", pipeline="none", **QUIET)).manifest
    assert len(m.classes) == MAX_UNNAMED_CLASSES


def test_with_a_data_yaml_its_names_decide(raw, tmp_path):
    m = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET)).manifest
    assert m.classes == tuple(object_classes(3))
