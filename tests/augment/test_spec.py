"""Augment specs: text parsed into transforms without running it, and written back."""

from __future__ import annotations

import pytest

from cachekit.augment.spec import MAX_SPEC_CHARS, catalogue, format_spec, parse_spec
from cachekit.transforms import ColorJitter, Letterbox, RandomHorizontalFlip, RandomResizedCrop


def test_a_spec_names_transforms_with_literal_arguments():
    steps = parse_spec(
        "RandomResizedCrop(224, scale=(0.35, 1)), RandomHorizontalFlip, ColorJitter(0.4, hue=0.1)"
    )
    assert steps == [
        RandomResizedCrop(224, scale=(0.35, 1)),
        RandomHorizontalFlip(),
        ColorJitter(0.4, hue=0.1),
    ]
    assert parse_spec("") == [] and parse_spec("none") == []
    assert set(catalogue()) >= {"RandomResizedCrop", "Letterbox", "ColorJitter"}


def test_format_spec_round_trips():
    steps = [
        Letterbox(640, fill=0),
        RandomHorizontalFlip(0.25),
        RandomResizedCrop((96, 128), ratio=(0.5, 2.0)),
    ]
    text = format_spec(steps)
    assert parse_spec(text) == steps
    assert format_spec(None) == "" and format_spec([lambda x: x]) is None


@pytest.mark.parametrize(
    "spec, why",
    [
        ('__import__("os").system("true")', "not a transform's name"),
        ("os.system('true')", "not a transform's name"),
        ("RandomResizedCrop(open('/etc/passwd').read())", "must be literals"),
        ("RandomResizedCrop(2**4000)", "must be literals"),
        ("RandomResizedCrop(size)", "must be literals"),
        ("RandomResizedCrop(*[224])", r"\*arguments"),
        ("RandomResizedCrop(**{'size': 224})", r"\*\*arguments"),
        ("Eval(1)", "unknown transform 'Eval'"),
        ("RandomResizedCrop(-1)", "RandomResizedCrop: size must be"),
        ("RandomHorizontalFlip(p=float('nan'))", "must be literals"),
        ("RandomHorizontalFlip(p=1e999)", "p must be a number in"),
        ("RandomResizedCrop(224, colour=1)", "unexpected keyword"),
        ("RandomResizedCrop(224", "not a list of transforms"),
        ("[" * 2000, "not a list of transforms"),
        ("lambda: 0", "not a transform's name"),
        ("x" * (MAX_SPEC_CHARS + 1), "characters"),
    ],
)
def test_hostile_specs_are_refused_in_one_line(spec, why):
    with pytest.raises(ValueError, match=why) as info:
        parse_spec(spec)
    assert "\n" not in str(info.value)


def test_a_keyword_given_twice_is_refused_not_the_last_taken():
    # Python refuses f(size=8, size=9); the spec must too, not read it as Resize(9)
    with pytest.raises(ValueError, match="size= is given twice"):
        parse_spec("Resize(size=8, size=9)")


def test_a_refusal_quoting_a_long_argument_stays_short():
    with pytest.raises(ValueError) as caught:
        parse_spec("Resize(" + "9" * 3000 + ")")
    message = str(caught.value)
    assert "\n" not in message and len(message) <= 300 and message.startswith("augment spec: Resize")
    with pytest.raises(ValueError) as caught:
        parse_spec(f"RandomIoUCrop(sampler_options={[0.5] * 600})")
    assert len(str(caught.value)) <= 300


def test_numpy_arguments_write_back_as_literals():
    """A loader's state keeps its plan as text: numpy scalars (sizes from arrays, p from float32
    configs) must write back, or a resumed epoch reads with other transforms."""
    np = pytest.importorskip("numpy")
    from cachekit.transforms import RandAugment, RandomIoUCrop, Resize

    steps = [
        Resize((np.int64(8), 8)),
        RandomHorizontalFlip(np.float32(0.3)),
        RandomIoUCrop(sampler_options=np.array([0.1, 0.5])),
        RandAugment(np.int64(2)),
    ]
    text = format_spec(steps)
    assert text is not None and "np." not in text
    assert parse_spec(text) == steps


def test_an_autoaugment_policy_given_as_an_enum_writes_back():
    """torchvision's ``AutoAugmentPolicy.IMAGENET`` is taken; a loader's state must be able to write it."""
    import enum

    from cachekit.transforms import AutoAugment

    class Policy(enum.Enum):  # what torchvision's AutoAugmentPolicy is
        SVHN = "svhn"

    step = AutoAugment(Policy.SVHN)
    assert step == AutoAugment("svhn") == AutoAugment("SVHN")
    assert parse_spec(format_spec([step])) == [step]
