"""The user's own ops as a careless or hostile user writes them: what each returns is taken as it is
(a view of the batch, a transposed or expanded one) or refused in one line that says what came back;
ops of one function given other arguments (a partial, a callable object, an object's method) are
told apart in a loader's state; an op that cannot reach worker processes (a notebook's function,
an object holding a lock) is refused when the loader is made; ``augment_on="auto"`` reads a list
with a ``PixelOp`` on the threads.

Every loader reads a real cache of flat-coloured rectangles with boxes and masks, stored at one size,
64 x 64, so that a transpose keeps the batch's shape.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.errors import UsageError
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import BatchOp, MatrixOp, PixelOp, Resize

SEED = 11
THREADS = {"augment_on": "threads", "threads": 2}
DEVICE = {"device": "cpu", "augment_on": "device"}
BASE = [Resize((64, 64))]


@pytest.fixture(scope="module")
def square(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    raw = make_object_dataset(tmp / "raw", 8, size=(48, 64), classes=3, seed=2)
    config = BuildConfig(
        annotations="yolo", masks=str(raw / "masks"), workers=1, progress=False, pipeline="classification-224", size=64
    )
    build(raw, tmp / "cache", config)
    return CachedDataset(tmp / "cache")


def _images(ds, augment, **path) -> list[torch.Tensor]:
    loader = make_loader(ds, 4, seed=SEED, augment=augment, shuffle=False, **path)
    return [x.clone() for x, _ in loader]


def _refusal(ds, augment, **path) -> str:
    with pytest.raises(UsageError) as caught:
        _images(ds, augment, **path)
    text = str(caught.value)
    assert "\n" not in text
    return text


# -- a BatchOp may return a view of the batch it was given ---------------------------------------------


def transposed(images, generator):
    """Rows become columns: a view of the same memory, in other strides."""
    return images.transpose(-1, -2)


def all_first(images, generator):
    """Every sample the batch's first: a view of the same memory, its first row repeated."""
    return images[:1].expand_as(images)


def inverted_in_place(images, generator):
    return images.copy_(255 - images)


@pytest.mark.parametrize("path", [THREADS, DEVICE], ids=["threads", "device"])
@pytest.mark.parametrize(
    ("fn", "want"),
    [
        (transposed, lambda x: x.transpose(-1, -2)),
        (all_first, lambda x: x[:1].expand_as(x)),
        (inverted_in_place, lambda x: 255 - x),
    ],
    ids=["transpose", "expand", "in-place"],
)
def test_a_batch_op_returning_a_view_of_its_batch_is_what_the_loader_gives(square, path, fn, want):
    plain = _images(square, BASE, **path)
    got = _images(square, [*BASE, BatchOp(fn)], **path)
    assert len(got) == len(plain) == 2
    for a, b in zip(plain, got, strict=True):
        assert not torch.equal(a, b)
        assert torch.equal(b, want(a))


# -- what came back instead of an image, a batch or a matrix, said as it is ---------------------------


def none_image(image, rng):
    image[...] = 0  # changed in place and nothing returned


def tensor_image(image, rng):
    return torch.from_numpy(image)


def numpy_batch(images, generator):
    return images.numpy()


def listed_batch(images, generator):
    return list(images)


def no_matrix(height, width, rng):
    return None


def complex_matrix(height, width, rng):
    return np.eye(3) * (1 + 1j)


def uneven_rows(height, width, rng):
    return [[1.0, 0.0, 0.0], [0.0, 1.0], [0.0, 0.0, 1.0]]


def text_matrix(height, width, rng):
    return "identity"


@pytest.mark.parametrize(
    ("op", "path", "said"),
    [
        (PixelOp(none_image), THREADS, r"PixelOp\(test_user_ops_hostile.none_image\) returned None for sample \d+, "
         r"not the uint8 \[64, 64, 3\] numpy image"),
        (PixelOp(tensor_image), THREADS, r"returned a torch.Tensor for sample \d+, not the uint8 \[64, 64, 3\] numpy"),
        (BatchOp(numpy_batch), THREADS, r"returned a numpy.ndarray for the batch starting at sample \d+, not the "
         r"uint8 \[4, 3, 64, 64\] torch batch"),
        (BatchOp(numpy_batch), DEVICE, r"returned a numpy.ndarray for the batch starting at sample \d+"),
        (BatchOp(listed_batch), THREADS, r"returned a list for the batch starting at sample \d+, not the uint8"),
        (MatrixOp(no_matrix), THREADS, r"MatrixOp\(test_user_ops_hostile.no_matrix\) returned None for sample \d+, "
         r"not a 3x3 matrix$"),
        (MatrixOp(complex_matrix), THREADS, r"returned a complex128 \[3, 3\] array for sample \d+, not a 3x3 matrix$"),
        (MatrixOp(complex_matrix), DEVICE, r"returned a complex128 \[3, 3\] array for sample \d+"),
        (MatrixOp(uneven_rows), THREADS, r"uneven_rows\) returned a list of uneven rows for sample \d+, not a 3x3"),
        (MatrixOp(text_matrix), DEVICE, r"text_matrix\) returned a str for sample \d+, not a 3x3 matrix$"),
    ],
)  # fmt: skip
def test_what_an_op_returned_instead_is_named_in_its_refusal(square, op, path, said):
    text = _refusal(square, [*BASE, op], **path)
    assert text.startswith("augment: ")
    assert "raised" not in text  # the op returned; it did not raise
    assert re.search(said, text), text


def listed_matrix(height, width, rng):
    """A transpose, as a list of integer rows."""
    return [[0, 1, 0], [1, 0, 0], [0, 0, 1]]


def tensor_matrix(height, width, rng):
    return torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])


@pytest.mark.parametrize("fn", [listed_matrix, tensor_matrix])
def test_a_matrix_given_as_a_list_of_integers_or_a_tensor_is_taken(square, fn):
    plain = _images(square, None, **THREADS)
    got = _images(square, [MatrixOp(fn)], **THREADS)
    assert all(torch.equal(b, a.transpose(-1, -2)) for a, b in zip(plain, got, strict=True))


# -- ops of one function given other arguments: told apart by name, in messages and in a state --------


def add(image, rng, value):
    return (image.astype(np.int16) + value).clip(0, 255).astype(np.uint8)


class Add:
    """A callable class: its fields are its arguments."""

    def __init__(self, value):
        self.value = value

    def __call__(self, image, rng):
        return add(image, rng, self.value)


def offset(value, image, rng):
    """The amount first: ``functools.partial(offset, 10)`` binds it by position."""
    return add(image, rng, value)


@dataclasses.dataclass(frozen=True)
class Added:
    """A callable dataclass: its own repr names its fields."""

    value: int

    def __call__(self, image, rng):
        return add(image, rng, self.value)


class Brightness:
    """An object whose method is the op."""

    def __init__(self, value):
        self.value = value

    def shift(self, image, rng):
        return add(image, rng, self.value)


def _partial(value):
    return PixelOp(functools.partial(add, value=value))


def _state(ds, augment):
    loader = make_loader(ds, 3, seed=SEED, augment=augment, shuffle=False, **THREADS)
    it = iter(loader)
    head = next(it)[0].clone()
    state = loader.state_dict()
    del it
    return head, state


@pytest.mark.parametrize(
    ("made", "name"),
    [
        (_partial, "test_user_ops_hostile.add(value=10)"),
        (lambda v: PixelOp(Add(v)), "test_user_ops_hostile.Add(value=10)"),
        (lambda v: PixelOp(Brightness(v).shift), "test_user_ops_hostile.Brightness(value=10).shift"),
        (lambda v: PixelOp(functools.partial(offset, v)), "test_user_ops_hostile.offset(10)"),
        (lambda v: PixelOp(Added(v)), "test_user_ops_hostile.Added(value=10)"),
    ],
    ids=["partial", "callable-class", "method", "partial-by-position", "dataclass"],
)
def test_ops_of_one_function_with_other_arguments_are_named_apart_and_resume_exactly(square, made, name):
    assert repr(made(10)) == f"PixelOp({name})"
    two = [*BASE, made(10), made(-20)]
    full = [x.clone() for x, _ in make_loader(square, 3, seed=SEED, augment=two, shuffle=False, **THREADS)]
    head, state = _state(square, two)
    assert state["augment"] is not None and name in state["augment"]
    assert name.replace("10", "-20") in state["augment"]
    resumed = make_loader(square, 3, seed=SEED, augment=[*BASE, made(10), made(-20)], shuffle=False, **THREADS)
    resumed.load_state_dict(state)
    got = [head] + [x.clone() for x, _ in resumed]
    assert len(got) == len(full) and all(torch.equal(a, b) for a, b in zip(got, full, strict=True))
    other = make_loader(square, 3, seed=SEED, augment=[*BASE, made(10), made(20)], shuffle=False, **THREADS)
    with pytest.raises(UsageError, match=r"-20\)(\.shift)?'\) is the user's own op, and this loader was not given it"):
        other.load_state_dict(state)


def test_a_failing_partial_is_named_with_its_arguments(square):
    text = _refusal(square, [*BASE, PixelOp(functools.partial(add, value="x"))])
    assert text.startswith("augment: PixelOp(test_user_ops_hostile.add(value='x')) raised "), text


# -- an op defined where worker processes cannot find it -------------------------------------------------

INTERACTIVE = """
import numpy as np
from cachekit import make_loader
from cachekit.errors import UsageError
from cachekit.transforms import PixelOp, Resize

def inverted(image, rng):
    return 255 - image

try:
    loader = make_loader({root!r}, 4, seed=1, augment=[Resize((64, 64)), PixelOp(inverted)], workers=1, threads=1,
                         timeout=30{context})
    print("batches", sum(1 for _ in loader))
except UsageError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize(
    "context", [", multiprocessing_context='spawn'", ", multiprocessing_context='forkserver'", ""],
    ids=["spawn", "forkserver", "default-fork"],
)
def test_an_op_of_an_interactive_session_is_refused_for_workers_that_start_afresh(square, context):
    """A notebook's function (here ``python -c``'s) lives in a ``__main__`` a spawned or forkserver's
    worker never runs: each worker died unpickling it and the loader waited out its timeout. Refused
    when made; a forked worker (the default, as torch's on Linux) inherits it and reads every batch."""
    code = INTERACTIVE.format(root=str(square.root), context=context)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    if not context:
        assert done.stdout.strip() == "batches 2"
    else:
        assert done.stdout.strip() == (
            "refused: augment: PixelOp(__main__.inverted) cannot be sent to the loader's worker processes: it is "
            "defined in an interactive session (a notebook, python -c), which they do not run: define it in a "
            "module file and import it, or pass workers=0"
        )


# -- an op that raises something hard to say --------------------------------------------------------------


class Unsayable(Exception):
    def __str__(self):
        raise RuntimeError("this exception cannot be shown")


def raises_unsayable(image, rng):
    raise Unsayable


def raises_after_a_blank_line(images, generator):
    raise RuntimeError("\n   the real reason\n   and more")


@pytest.mark.parametrize(
    ("op", "said"),
    [
        (PixelOp(raises_unsayable), r"^augment: PixelOp\(test_user_ops_hostile.raises_unsayable\) raised Unsayable "
         r"on sample \d+$"),
        (BatchOp(raises_after_a_blank_line), r"raised RuntimeError: the real reason on the batch starting at sample "
         r"\d+$"),
    ],
)  # fmt: skip
def test_an_exception_that_cannot_say_itself_or_starts_blank_is_still_one_line(square, op, said):
    assert re.search(said, _refusal(square, [*BASE, op], **THREADS))


# -- augment_on="auto" with a PixelOp -------------------------------------------------------------------


def test_auto_reads_a_list_with_a_pixel_op_on_the_threads_even_with_a_cuda_device():
    """``augment_on="auto"`` on a CUDA device chose the device, where a PixelOp is refused: a user who
    never asked for the device was told to pass augment_on='threads'. Asked for, it is still refused."""
    from cachekit.augment.plan import compile_plan
    from cachekit.feed.loaderchecks import choose_augment_on

    cuda = torch.device("cuda")
    with_pixel_op = compile_plan([*BASE, PixelOp(tensor_image), BatchOp(transposed)])
    without = compile_plan([*BASE, BatchOp(transposed)])
    assert choose_augment_on("auto", cuda, with_pixel_op) is False
    assert choose_augment_on("auto", cuda, without) is True
    assert choose_augment_on("device", cuda, with_pixel_op) is True  # and check_augment_plan refuses it
    assert choose_augment_on("auto", torch.device("cpu"), without) is False


def test_a_pixel_op_asked_for_on_the_device_is_still_refused_and_auto_reads_it(square):
    with pytest.raises(UsageError, match=r"PixelOp\(test_user_ops_hostile.add\(value=5\)\) runs numpy .* BatchOp"):
        make_loader(square, 4, augment=[*BASE, PixelOp(functools.partial(add, value=5))], **DEVICE)
    plain = _images(square, BASE, device="cpu")
    got = _images(square, [*BASE, PixelOp(functools.partial(add, value=5))], device="cpu")
    assert all(torch.equal(b, (a.int() + 5).clamp(max=255).to(torch.uint8)) for a, b in zip(plain, got, strict=True))


class Locked:
    """A callable object holding a lock: defined at the top level, and still it does not pickle."""

    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, image, rng):
        with self.lock:
            return image


def test_an_op_that_does_not_pickle_for_another_reason_than_a_lambda_says_why(square):
    with pytest.raises(UsageError) as caught:
        make_loader(square, 4, seed=SEED, augment=[*BASE, PixelOp(Locked())], workers=1)
    assert str(caught.value) == (
        "augment: PixelOp(test_user_ops_hostile.Locked(lock=...)) cannot be sent to the loader's worker processes: "
        "it does not pickle (TypeError: cannot pickle '_thread.lock' object): give it only what pickles, or pass "
        "workers=0"
    )
    assert len(_images(square, [*BASE, PixelOp(Locked())], **THREADS)) == 2  # in this process: fine


# -- an argument an op's name cannot show --------------------------------------------------------------


def test_a_keyword_the_name_cannot_show_is_not_named_none(square):
    """A partial's keyword whose value has no one-line repr (an object's address) is shown as ``...``,
    as a positional one is: named ``value=None`` it passed for an op given None, and a loader resumed
    with ``value=None`` took its state as written by the same list."""
    hidden = PixelOp(functools.partial(add, value=object()))
    assert repr(hidden) == "PixelOp(test_user_ops_hostile.add(value=...))"
    assert hidden.spec_text() != PixelOp(functools.partial(add, value=None)).spec_text()
    seven = np.full((64, 1, 1), 7, np.int16)  # one amount a row: a repr of many lines
    _, state = _state(square, [*BASE, PixelOp(functools.partial(add, value=seven))])
    resumed = make_loader(square, 3, seed=SEED, augment=[*BASE, _partial(None)], shuffle=False, **THREADS)
    with pytest.raises(UsageError, match="made with the same augment list"):
        resumed.load_state_dict(state)


def test_an_op_holding_a_set_has_one_name_in_every_process():
    """A set's order changes with each process's hash seed: an op given one (a partial's argument, an
    object's field) is named with its members sorted, so a loader resumed in a new process matches."""
    code = (
        "import functools, numpy; from cachekit.transforms import PixelOp\n"
        "class Drop:\n"
        "    def __init__(self, names): self.names = names\n"
        "    def __call__(self, image, rng): return image\n"
        "names = ['nose', 'left_eye', 'right_eye', 'left_ear', 'right_ear', 'tail']\n"
        "print(PixelOp(functools.partial(numpy.clip, names=set(names))).spec_text())\n"
        "print(PixelOp(Drop([frozenset(names), {'k': set(names[:3])}])).spec_text())\n"
    )
    names = set()
    for seed in ("1", "2"):
        env = {**__import__("os").environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        names.add(done.stdout)
    (text,) = names
    assert "names={'left_ear', 'left_eye', 'nose', 'right_ear', 'right_eye', 'tail'}" in text


class Chosen:
    """A callable object that picks one of its own methods when made: a field that refers back to it."""

    def __init__(self, value, brighter=True):
        self.value = value
        self.impl = self.brighten if brighter else self.darken

    def brighten(self, image, rng):
        return add(image, rng, self.value)

    def darken(self, image, rng):
        return add(image, rng, -self.value)

    def __call__(self, image, rng):
        return self.impl(image, rng)


def test_an_object_whose_field_is_its_own_method_is_named(square):
    """Naming its field named the object again, and again: a RecursionError's traceback when the op was
    made. Where it refers back, it is named by its class; the two choices are told apart."""
    brighter, darker = PixelOp(Chosen(10)), PixelOp(Chosen(10, brighter=False))
    assert repr(brighter) == "PixelOp(test_user_ops_hostile.Chosen(value=10, impl=test_user_ops_hostile.Chosen.brighten))"
    assert brighter.spec_text() != darker.spec_text()
    images = _images(square, [*BASE, brighter], **THREADS)
    plain = _images(square, [*BASE, PixelOp(Add(10))], **THREADS)
    assert all(torch.equal(a, b) for a, b in zip(images, plain, strict=True))


def test_an_op_of_an_interactive_session_reaches_workers_the_loader_forks(square):
    """Workers that fork (the default, here with a dataset that does not pickle) inherit the session's
    functions: its op is read there, not refused as for a forkserver; so is one a later
    ``set_augment`` gives the same workers."""
    code = INTERACTIVE.replace("make_loader({root!r}", "make_loader(ds").replace(
        "try:\n", "from cachekit import CachedDataset\nds = CachedDataset({root!r}, transform=lambda x: x)\ntry:\n"
    ).replace(
        '    print("batches", sum(1 for _ in loader))\n',
        '    print("batches", sum(1 for _ in loader))\n'
        "    loader.set_augment([Resize((32, 32)), PixelOp(inverted)])\n"
        '    print("then", sum(1 for _ in loader))\n',
    )
    code = "import warnings\nwarnings.simplefilter('ignore')\n" + code.format(root=str(square.root), context="")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["batches", "2", "then", "2"]


@pytest.mark.parametrize("run", [["-m", "trainer"], ["trainer"]], ids=["python-m-package", "python-folder"])
def test_an_op_of_a_packages_main_is_refused_for_workers_that_start_afresh(square, tmp_path, run):
    """``python -m package`` runs its ``__main__.py``, which multiprocessing never runs again in a worker
    started afresh (nor a folder's or a zip's): its op was let through, and each worker died
    unpickling it, a traceback after the loader's timeout. Refused when made, as a notebook's is."""
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        INTERACTIVE.format(root=str(square.root), context=", multiprocessing_context='spawn'")
    )
    done = subprocess.run(
        [sys.executable, *run], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (
        "refused: augment: PixelOp(__main__.inverted) cannot be sent to the loader's worker processes: it is "
        "defined in a package's __main__.py (python -m package), which they do not run: define it in a "
        "module file and import it, or pass workers=0"
    )


class Slotted:
    """A callable class with ``__slots__``: its fields live in no ``__dict__``."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __call__(self, image, rng):
        return add(image, rng, self.value)


def test_a_callable_object_with_slots_is_named_with_its_fields(square):
    """Named ``Slotted()`` whatever its value, a loader resumed with another value took the state as
    its own list, and read other pixels than the epoch it resumed."""
    assert repr(PixelOp(Slotted(10))) == "PixelOp(test_user_ops_hostile.Slotted(value=10))"
    _, state = _state(square, [*BASE, PixelOp(Slotted(10))])
    resumed = make_loader(square, 3, seed=SEED, augment=[*BASE, PixelOp(Slotted(20))], shuffle=False, **THREADS)
    with pytest.raises(UsageError, match="made with the same augment list"):
        resumed.load_state_dict(state)


@pytest.mark.parametrize("value", [(1,), (), [1, "a"], {"k": (2, 3)}, frozenset(), set(), {0.5}, [{"b", "a"}]])
def test_an_argument_is_named_as_python_writes_it(value):
    """A set's members are sorted for the name, and nothing else of a container's text changes."""
    shown = repr(value) if not isinstance(value, list) or not value or not isinstance(value[0], set) else "[{'a', 'b'}]"
    assert repr(PixelOp(functools.partial(add, value=value))) == f"PixelOp(test_user_ops_hostile.add(value={shown}))"
