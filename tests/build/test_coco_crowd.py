"""COCO's ``iscrowd`` survives a build box for box: the stored flags are the JSON's."""

from __future__ import annotations

import json

import numpy as np

from cachekit import BuildConfig, CachedDataset, build
from cachekit.tools.synthetic_objects import make_object_dataset


def test_the_stored_crowd_flags_equal_the_jsons(tmp_path):
    raw = make_object_dataset(tmp_path / "raw", 6, size=(40, 60), classes=3, most=5)
    coco = json.loads((raw / "coco.json").read_text())
    for ann in coco["annotations"]:
        ann["iscrowd"] = int(ann["id"] % 3 == 1)  # some crowds, some not, in every image
    path = tmp_path / "crowd.json"
    path.write_text(json.dumps(coco))
    build(raw, tmp_path / "c", BuildConfig(annotations=str(path), pipeline="none", workers=1, progress=False))
    files = {img["id"]: img["file_name"] for img in coco["images"]}
    want = {}  # (file, x1, y1, x2, y2) -> the JSON's flag
    for ann in coco["annotations"]:
        x, y, w, h = ann["bbox"]
        want[(files[ann["image_id"]], *np.round([x, y, x + w, y + h], 3).tolist())] = ann["iscrowd"]
    ds = CachedDataset(tmp_path / "c")
    got = {}
    for i in range(len(ds)):
        _, target = ds[i]
        for box, crowd in zip(target["boxes"].tolist(), target["iscrowd"].tolist()):
            got[(ds.source(i), *np.round(box, 3).tolist())] = crowd
    assert got == want and 0 < sum(want.values()) < len(want)
