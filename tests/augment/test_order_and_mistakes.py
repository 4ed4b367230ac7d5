"""An augment list runs in the order it is written, or is refused in one line that says the fix; so is a
transform class given where an instance belongs, a schedule that does not return a list, and a Mosaic
on a cache with nothing for it to carry (no boxes, no masks).

Every loader here is a real ``make_loader`` over a real cache; the orders the plan may keep are checked
on real pixels: what the user wrote (a pixel op, then a flip) equals what the loader gives.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.augment.plan import compile_plan
from cachekit.augment.spec import parse_spec
from cachekit.errors import UsageError
from cachekit.feed.schedule import is_schedule_function
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import (
    CenterCrop,
    ColorJitter,
    CutMix,
    GaussianBlur,
    Letterbox,
    MixUp,
    MixUpOrCutMix,
    Mosaic,
    RandAugment,
    RandomAffine,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomHSV,
    RandomResizedCrop,
    RandomRotation,
    RandomVerticalFlip,
    Resize,
)

SEED = 3


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text and len(text) < 300, text
    return text


def _refused(dataset, augment, *match: str, **options) -> str:
    with pytest.raises(UsageError) as info:
        make_loader(dataset, 8, seed=SEED, augment=augment, **options)
    text = _one_line(info.value)
    for part in match:
        assert part in text, text
    return text


@pytest.fixture(scope="module")
def boxes_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("order_boxes")
    make_object_dataset(root / "raw", 8, size=(48, 64), classes=3)
    build(root / "raw", root / "cache", BuildConfig(annotations="yolo", pipeline="none", workers=1, progress=False))
    return root / "cache"


@pytest.fixture(scope="module")
def masks_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("order_masks")
    raw = make_object_dataset(root / "raw", 8, size=(48, 64), classes=3)
    config = BuildConfig(masks=str(raw / "masks"), pipeline="none", workers=1, progress=False)
    build(raw, root / "cache", config)
    return root / "cache"


def _epoch(loader, epoch: int = 0) -> list[torch.Tensor]:
    loader.set_epoch(epoch)
    return [batch[0].clone() for batch in loader]


# -- 1. batch ops before per-sample steps ----------------------------------------------------------


@pytest.mark.parametrize("batch", [MixUp(), CutMix(), MixUpOrCutMix()], ids=lambda s: type(s).__name__)
@pytest.mark.parametrize(
    "later",
    [RandomResizedCrop(16), RandomHorizontalFlip(), ColorJitter(0.4), RandAugment(), RandomErasing()],
    ids=lambda s: type(s).__name__,
)
def test_a_batch_op_listed_before_a_per_sample_step_is_refused_with_the_fix(small_cache, batch, later):
    name, after = type(batch).__name__, type(later).__name__
    ds = CachedDataset(small_cache)
    _refused(ds, [CenterCrop(24), batch, later], f"{name} mixes whole batches", f"list it after {after}")
    loader = make_loader(ds, 8, seed=SEED, augment=[CenterCrop(24), later, batch])  # the order it runs in
    assert loader.augment_for(0).mix is not None


def test_the_refusal_names_the_last_per_sample_step_and_batch_ops_keep_any_order(small_cache):
    ds = CachedDataset(small_cache)
    _refused(
        ds,
        [RandomResizedCrop(16), MixUp(), RandomHorizontalFlip(), RandAugment(), CutMix()],
        "MixUp mixes whole batches",
        "list it after RandAugment",
    )
    for steps in ([RandomResizedCrop(16), MixUp(), CutMix()], [RandomResizedCrop(16), CutMix(), MixUp()]):
        assert make_loader(ds, 8, seed=SEED, augment=steps).augment_for(0).mix.switch_prob == 0.5


def test_ultralytics_order_with_mixup_before_hsv_and_flip_is_refused_on_a_detection_cache(boxes_cache):
    # Ultralytics: Mosaic -> RandomAffine -> MixUp -> HSV -> flip; here MixUp mixes the finished samples
    steps = [Mosaic(32), RandomAffine(translate=(0.1, 0.1)), MixUp(), RandomHSV(), RandomHorizontalFlip()]
    _refused(CachedDataset(boxes_cache), steps, "MixUp mixes whole batches", "list it after RandomHorizontalFlip")
    make_loader(boxes_cache, 4, seed=SEED, augment=[*steps[:2], *steps[3:], MixUp()])


# -- 1. per-sample steps the plan would run in another order ---------------------------------------


@pytest.mark.parametrize(
    "steps, match",
    [
        ([ColorJitter(0.4), RandomResizedCrop(16)], ["ColorJitter", "list it after RandomResizedCrop"]),
        ([ColorJitter(0.4), CenterCrop(16), RandomHorizontalFlip()], ["list it after CenterCrop"]),
        ([RandomErasing(), RandomResizedCrop(16)], ["RandomErasing", "list it after RandomResizedCrop"]),
        ([RandomErasing(), RandomResizedCrop(16), RandomHorizontalFlip()], ["list it after RandomHorizontalFlip"]),
        ([RandomGrayscale(), RandomResizedCrop(16), RandomHorizontalFlip()], ["list it after RandomResizedCrop"]),
        ([RandAugment(), RandomHorizontalFlip()], ["RandAugment", "list it after RandomHorizontalFlip"]),
        ([GaussianBlur(3), RandomVerticalFlip()], ["GaussianBlur", "list it after RandomVerticalFlip"]),
        ([RandomGrayscale(), Resize((16, 16))], ["RandomGrayscale", "list it after Resize"]),
        ([RandomHSV(), RandomRotation(10)], ["RandomHSV", "list it after RandomRotation"]),
        ([CenterCrop(16), RandAugment(), ColorJitter(0.4)], ["ColorJitter", "list it before RandAugment"]),
        ([CenterCrop(16), RandomGrayscale(), ColorJitter(0.4)], ["ColorJitter", "list it before RandomGrayscale"]),
    ],
    ids=lambda v: "-".join(type(s).__name__ for s in v) if isinstance(v, list) and not isinstance(v[0], str) else "",
)
def test_a_step_the_plan_would_run_elsewhere_is_refused(small_cache, steps, match):
    _refused(CachedDataset(small_cache), steps, *match)


def test_mosaic_after_any_step_is_a_usage_error_with_the_fix(boxes_cache):
    for first in (RandomAffine(10), RandomHorizontalFlip(), RandomHSV(), Letterbox(32)):
        text = _refused(CachedDataset(boxes_cache), [first, Mosaic(32)], "Mosaic must come first")
        assert "list it before" in text and type(first).__name__ in text
    assert make_loader(boxes_cache, 4, augment=[Mosaic(32), RandomAffine(10), RandomHSV()]).augment_for(0).mosaic
    _refused(CachedDataset(boxes_cache), [Mosaic(32), Mosaic(32)], "give one Mosaic, first")


@pytest.mark.parametrize("pixel", [RandomGrayscale(p=1.0), RandomHSV(), ColorJitter(0.5, 0.5, 0.5, 0.1)],
                         ids=lambda s: type(s).__name__)  # fmt: skip
@pytest.mark.parametrize("flip", [RandomHorizontalFlip(p=1.0), RandomVerticalFlip(p=1.0)], ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("on_device", [False, True], ids=["threads", "device"])
def test_a_per_pixel_op_before_a_flip_is_kept_and_gives_what_was_written(small_cache, pixel, flip, on_device):
    """The plan runs flips with the geometry, before ColorJitter and the pixel stage; a per-pixel op
    commutes with a mirror exactly, so the list is taken and its pixels are the op's, then mirrored."""
    ds = CachedDataset(small_cache)
    options = {"device": "cpu", "augment_on": "device"} if on_device else {}
    written = make_loader(ds, 8, seed=SEED, shuffle=False, augment=[CenterCrop(16), pixel, flip], **options)
    unflipped = make_loader(ds, 8, seed=SEED, shuffle=False, augment=[CenterCrop(16), pixel], **options)
    axis = -1 if isinstance(flip, RandomHorizontalFlip) else -2
    got, want = _epoch(written), _epoch(unflipped)
    assert len(got) == len(want) == 5
    for a, b in zip(got, want):
        assert torch.equal(a, b.flip(axis))
        assert not torch.equal(a, b)  # the flip did happen


def test_the_yolo_recipe_of_the_readme_is_taken_as_written(boxes_cache):
    tail = [RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.5, 1.5), fill=114), RandomHSV(h=0.015, s=0.7, v=0.4),
            RandomHorizontalFlip()]  # fmt: skip
    loader = make_loader(boxes_cache, 4, seed=SEED, augment=[Mosaic(32), *tail], collate="yolo")
    loader.set_augment([Letterbox(32), *tail])
    assert loader.augment_for(1).listed[0] == Letterbox(32)


# -- 2. a class where an instance belongs ---------------------------------------------------------


@pytest.mark.parametrize(
    "augment, name, call",
    [
        (RandomHorizontalFlip, "RandomHorizontalFlip", "RandomHorizontalFlip()"),
        ([RandomHorizontalFlip], "RandomHorizontalFlip", "RandomHorizontalFlip()"),
        ([RandomResizedCrop], "RandomResizedCrop", "RandomResizedCrop(size)"),
        (ColorJitter, "ColorJitter", "ColorJitter()"),
        (RandomRotation, "RandomRotation", "RandomRotation(degrees)"),
        ([RandomResizedCrop(16), MixUp], "MixUp", "MixUp()"),
        ((CenterCrop(16), GaussianBlur), "GaussianBlur", "GaussianBlur(kernel_size)"),
    ],
    ids=lambda v: "",
)
def test_a_transform_class_is_refused_with_its_call(small_cache, augment, name, call):
    ds = CachedDataset(small_cache)
    _refused(ds, augment, f"{name} is a class: write {call}")
    loader = make_loader(ds, 8, seed=SEED, augment=[CenterCrop(16)])
    with pytest.raises(UsageError, match=f"{name} is a class"):
        loader.set_augment(augment)
    assert {tuple(x.shape[-2:]) for x, _ in loader} == {(16, 16)}  # the refused one changed nothing


def test_a_transform_class_is_not_a_schedule():
    for cls in (RandomHorizontalFlip, ColorJitter, RandomRotation, MixUp, Mosaic, RandAugment):
        assert not is_schedule_function(cls)
    assert is_schedule_function(lambda epoch: [CenterCrop(16)])


def test_a_torch_module_is_no_schedule_and_is_refused_by_name(small_cache):
    # a torchvision v2 transform is an nn.Module that passes an int through: called with the epoch, it
    # returned 0, and the refusal spoke of an int
    for module in (torch.nn.Identity(), torch.nn.Sequential()):
        assert not is_schedule_function(module)
        with pytest.raises(TypeError, match=f"augment takes cachekit.transforms .* not {type(module).__name__};"):
            make_loader(CachedDataset(small_cache), 8, augment=module)


def test_compile_plan_refuses_a_class_in_one_line():
    with pytest.raises(UsageError, match=r"RandomHorizontalFlip is a class: write RandomHorizontalFlip\(\)"):
        compile_plan([RandomResizedCrop(16), RandomHorizontalFlip])
    with pytest.raises(TypeError, match="augment takes cachekit.transforms"):
        compile_plan([int])  # a class that is no transform: the list of transforms, as before


# -- 3. schedules that do not return a list -------------------------------------------------------


@pytest.mark.parametrize(
    "returned, shown",
    [(RandomHorizontalFlip(), "RandomHorizontalFlip"), (5, "int"), ("CenterCrop(16)", "str"),
     ({"crop": 16}, "dict")],  # fmt: skip
    ids=["a transform", "a number", "text", "a dict"],
)
def test_a_schedule_that_does_not_return_a_list_for_epoch_0_is_refused_when_the_loader_is_made(
    small_cache, returned, shown
):
    asked = []

    def schedule(epoch):
        asked.append(epoch)
        return returned

    text = _refused(CachedDataset(small_cache), schedule, "augment(0) returned", shown, "list of transforms")
    assert asked == [0] and "augment(0)" in text


def test_a_schedule_whose_later_epoch_is_not_a_list_fails_at_that_epoch_naming_it(small_cache):
    def schedule(epoch):
        return [CenterCrop(16)] if epoch == 0 else (RandomHorizontalFlip() if epoch == 1 else [RandomHorizontalFlip])

    loader = make_loader(CachedDataset(small_cache), 8, seed=SEED, augment=schedule)
    assert {tuple(x.shape[-2:]) for x, _ in loader} == {(16, 16)}
    with pytest.raises(UsageError) as info:
        next(iter(loader))
    assert "augment(1) returned RandomHorizontalFlip" in _one_line(info.value)
    loader.set_epoch(2)
    with pytest.raises(UsageError) as info:
        next(iter(loader))
    assert "augment(2)" in _one_line(info.value) and "RandomHorizontalFlip is a class" in str(info.value)


def test_a_schedule_may_still_return_none_or_a_tuple(small_cache):
    loader = make_loader(
        CachedDataset(small_cache), 8, seed=SEED, augment=lambda e: (CenterCrop(16),) if e % 2 else None
    )
    assert [{tuple(x.shape[-2:]) for x, _ in loader} for _ in range(2)] == [{(32, 32)}, {(16, 16)}]


def test_the_flip_class_as_augment_no_longer_runs_as_an_epoch_schedule(small_cache):
    # RandomHorizontalFlip(epoch): p=0 at epoch 0, every image flipped at 1, a ValueError at 2
    with pytest.raises(UsageError, match=r"write RandomHorizontalFlip\(\)"):
        make_loader(CachedDataset(small_cache), 8, augment=RandomHorizontalFlip)


class Compose:
    """A user's Compose, as torchvision and albumentations write one: its list, and a call on an image."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image):
        for t in self.transforms:
            image = t(image)
        return image


@pytest.mark.parametrize(
    ("augment", "said"),
    [
        ([CenterCrop(16), [RandomHorizontalFlip()]], "augment: a list inside the augment list: give one flat list"),
        ([(CenterCrop(16), RandomHorizontalFlip())], "augment: a tuple inside the augment list: give one flat list"),
        ((s for s in [CenterCrop(16)]), "augment takes a list of transforms in the order they run, not a generator"),
        ({CenterCrop(16)}, "augment takes a list of transforms in the order they run, not a set"),
        ([CenterCrop(16), None], "augment: None in the augment list: leave it out"),
        (Compose([CenterCrop(16)]), "augment: a Compose is not run as it is: give its cachekit.transforms as one flat list, augment=[...] (a function of your own goes in PixelOp(fn), BatchOp(fn) or MatrixOp(fn))"),
        ([Compose([CenterCrop(16)])], "augment: a Compose is not run as it is"),
    ],
    ids=["nested-list", "nested-tuple", "generator", "set", "none", "compose", "compose-in-list"],
)  # fmt: skip
def test_a_container_where_a_transform_belongs_is_refused_saying_what_it_is(small_cache, augment, said):
    """Each was refused by a line of every transform's name ending 'not list' (over 400 characters), and a
    Compose was called as a function of the epoch: 'augment(0) returned int'."""
    text = _refused(CachedDataset(small_cache), augment, said)
    assert text.startswith(said) and "augment(0)" not in text
    assert not is_schedule_function(Compose([CenterCrop(16)]))


def test_a_schedule_whose_later_epoch_nests_a_list_fails_at_that_epoch_saying_so(small_cache):
    loader = make_loader(
        CachedDataset(small_cache), 8, seed=SEED, augment=lambda e: [CenterCrop(16)] if e < 3 else [[CenterCrop(8)]]
    )
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert {tuple(x.shape[-2:]) for x, _ in loader} == {(16, 16)}
    loader.set_epoch(3)
    with pytest.raises(UsageError) as info:
        next(iter(loader))
    assert _one_line(info.value) == (
        "augment(3) returned a list this loader cannot read: augment: a list inside the augment list: give one "
        "flat list, augment=[*first, *second]"
    )


# -- 4. Mosaic, MixUp and CutMix where they mean nothing -------------------------------------------


def test_mosaic_on_a_classification_cache_is_refused(small_cache):
    ds = CachedDataset(small_cache)
    _refused(ds, [Mosaic(32)], "Mosaic", "boxes or masks")
    loader = make_loader(ds, 8, seed=SEED, augment=[CenterCrop(16)])
    with pytest.raises(UsageError, match="boxes or masks"):
        loader.set_augment([Mosaic(32), RandomAffine(5)])
    with pytest.raises(UsageError, match=r"augment\(0\).*boxes or masks"):
        make_loader(ds, 8, augment=lambda epoch: [Mosaic(32)])


def test_mosaic_on_boxes_or_masks_is_taken(boxes_cache, masks_cache):
    for cache in (boxes_cache, masks_cache):
        loader = make_loader(cache, 4, seed=SEED, augment=[Mosaic(32), RandomAffine(5)])
        images, *_ = next(iter(loader))
        assert images.shape[-2:] == (32, 32)


def test_mixup_of_a_detection_cache_is_taken_and_cutmix_refused(boxes_cache):
    make_loader(boxes_cache, 4, seed=SEED, augment=[Letterbox(32), MixUp()])
    for mix in (CutMix(), MixUpOrCutMix()):
        with pytest.raises(ValueError, match="CutMix needs a classification cache"):
            make_loader(boxes_cache, 4, seed=SEED, augment=[Letterbox(32), mix])


# -- text specs --------------------------------------------------------------------------------------


def test_a_spec_in_an_order_the_loader_would_not_run_is_refused_when_read():
    with pytest.raises(ValueError) as info:
        parse_spec("MixUp(), RandomResizedCrop(224)")
    text = _one_line(info.value)
    assert text.startswith("augment spec: MixUp mixes whole batches")
    assert isinstance(info.value, UsageError)
    with pytest.raises(ValueError, match="Mosaic must come first"):
        parse_spec("RandomAffine(10), Mosaic(640)")
    assert parse_spec("RandomResizedCrop(224), RandomHSV(), RandomHorizontalFlip(), MixUp()")[-1] == MixUp()


def _my_op(image, rng):
    return image


class _FakeTorchvisionFlip:  # what torchvision.transforms.v2.RandomHorizontalFlip() is to the list
    __module__ = "torchvision.transforms.v2._geometry"

    def __call__(self, image):
        return image


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ("RandomHorizontalFlip", "augment: the text 'RandomHorizontalFlip' in the augment list: give the transform itself, cachekit.transforms.RandomHorizontalFlip(...)"),
        ("flip it", "augment: the text 'flip it' in the augment list: give cachekit.transforms"),
        ("randomhorizontalflip", "augment: the text 'randomhorizontalflip' in the augment list: give the transform itself, cachekit.transforms.RandomHorizontalFlip(...)"),
        ("Blur", "augment: the text 'Blur' in the augment list: give cachekit.transforms, e.g. augment=[Resize(224)]"),
        (_my_op, "augment: the function _my_op in the augment list: wrap it as PixelOp(fn)"),
        (functools.partial(_my_op), "augment: the function _my_op in the augment list: wrap it as PixelOp(fn)"),
        (np.fliplr, "augment: the function fliplr in the augment list: wrap it as PixelOp(fn) (fn(image, rng) -> image, each sample), BatchOp(fn) (fn(images, generator) -> images, each batch) or MatrixOp(fn) (fn(height, width, rng) -> 3x3 map)"),
        (functools.partial(_FakeTorchvisionFlip()), "augment: the function partial in the augment list: wrap it as PixelOp(fn)"),
        (_FakeTorchvisionFlip(), "augment: _FakeTorchvisionFlip of torchvision is not run here: give the cachekit.transforms of the same name (torchvision's meanings), or your own function in PixelOp(fn), BatchOp(fn) or MatrixOp(fn)"),
    ],
    ids=["a-name", "text", "a-name-in-lower-case", "no-transform-of-ours", "function", "partial", "numpy-function",
         "partial-of-an-object", "torchvision"],
)  # fmt: skip
def test_a_name_a_function_or_another_librarys_transform_in_the_list_is_told_what_to_write(small_cache, item, said):
    """Each got the line of every transform's name (470 characters) ending 'not str' or 'not function'."""
    text = _refused(CachedDataset(small_cache), [CenterCrop(16), item], said)
    assert text.startswith(said) and len(text) < 260
