"""Which augmentation each epoch is read with: ``set_augment`` between epochs, or ``augment`` as a function of the epoch.

A pass over a loader keeps the plan it began with from its first batch to its last, wherever its
batches are read (this process's threads, the prefetch thread, worker processes: the plan travels
with every ``BatchRequest``), so no batch of an epoch is ever read with another epoch's plan. A
plan given to ``set`` takes effect when the next pass begins (Ultralytics' ``close_mosaic``: mosaic
off for the last epochs); a function of the epoch is asked once per epoch. A loader's state keeps
the plan of its epoch as text, so a run resumed mid-epoch reads the rest of it with that plan.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch

from ..augment.mistakes import is_compose
from ..augment.plan import AugmentUsageError, Plan, compile_plan
from ..augment.protocol import Transform
from ..augment.spec import format_spec, parse_spec

__all__ = ["AugmentSchedule", "is_schedule_function"]

_UNSET = object()
log = logging.getLogger("cachekit")


def is_schedule_function(augment) -> bool:
    """True for an ``augment`` that is a function of the epoch (not a list, nor one transform, nor a
    class: ``RandomHorizontalFlip`` is callable, but ``RandomHorizontalFlip(epoch)`` is no schedule;
    nor a torch module or torchvision transform, which would pass the epoch through as its output)."""
    return (
        callable(augment)
        and not isinstance(augment, (type, torch.nn.Module))
        and not type(augment).__module__.startswith("torchvision.")
        and not isinstance(augment, (list, tuple, Transform))
        and not is_compose(augment)
    )


def _returned(value) -> str:
    """What a schedule returned, named for its refusal."""
    return f"the class {value.__name__}" if isinstance(value, type) else type(value).__name__


class AugmentSchedule:
    """The plan of each pass of a loader.

    ``augment``: a list of ``cachekit.transforms`` (the same every epoch until ``set`` changes it),
    or a function ``augment(epoch) -> list | None``. ``check(plan)`` refuses, in one line, a plan
    the loader cannot read (a batch too large, a variable-sized cache without a fixed-size end).
    """

    def __init__(self, augment, *, min_visibility: float, check: Callable[[Plan | None], None]) -> None:
        compile_plan(None, min_visibility)  # min_visibility checked whatever augment is
        self.min_visibility = min_visibility
        self._check = check
        self._lock = threading.Lock()
        self._function: Callable | None = None
        self._current: Plan | None = None
        self._pending = _UNSET
        self._hold = False  # the pending plan waits one more pass (a resumed epoch's rest comes first)
        self._memo: tuple[int, Plan | None] | None = None
        self._install(self._source(augment))

    # -- what the loader is given ---------------------------------------------------------------

    def compile(self, transforms) -> Plan | None:
        """A list of transforms checked and compiled for this loader (None for no augmentation)."""
        plan = compile_plan(transforms, self.min_visibility)
        self._check(plan)
        return plan

    def _source(self, augment) -> tuple[str, object]:
        if is_schedule_function(augment):
            return ("function", augment)
        return ("plan", self.compile(augment))

    def _install(self, source: tuple[str, object]) -> None:
        kind, value = source
        self._function = value if kind == "function" else None
        self._current = value if kind == "plan" else None
        self._memo = None

    @property
    def scheduled(self) -> bool:
        """True when the plan is a function of the epoch."""
        return self._function is not None

    def set(self, augment) -> None:
        """From the next pass on, read with ``augment`` (a list of transforms, None, or a function
        of the epoch); checked now, so a bad list fails here in one line, not in a later epoch."""
        source = self._source(augment)
        with self._lock:
            self._pending, self._hold = source, False

    # -- what each pass reads with --------------------------------------------------------------

    def begin(self, epoch: int) -> Plan | None:
        """A pass begins as epoch ``epoch``: what ``set`` asked for takes effect; its plan."""
        with self._lock:
            if self._hold:
                self._hold = False
            elif self._pending is not _UNSET:
                self._install(self._pending)
                self._pending = _UNSET
        return self.plan_for(epoch)

    def plan_for(self, epoch: int) -> Plan | None:
        """The plan epoch ``epoch`` reads with (a function is asked once per epoch, then remembered)."""
        function = self._function
        if function is None:
            return self._current
        memo = self._memo
        if memo is not None and memo[0] == epoch:
            return memo[1]
        try:
            transforms = function(epoch)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"augment({epoch}) failed: {exc}") from exc
        if transforms is not None and not isinstance(transforms, (list, tuple)):
            raise AugmentUsageError(
                f"augment({epoch}) returned {_returned(transforms)}, not a list of transforms: a function "
                "of the epoch returns a list (or None: no augmentation that epoch)"
            )
        try:
            plan = self.compile(transforms)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"augment({epoch}) returned a list this loader cannot read: {exc}") from None
        self._memo = (epoch, plan)
        return plan

    def upcoming(self, epoch: int) -> Plan | None:
        """The plan a pass beginning now as ``epoch`` would read with, without beginning it."""
        with self._lock:
            pending = _UNSET if self._hold else self._pending
        if pending is _UNSET:
            return self.plan_for(epoch)
        kind, value = pending
        if kind == "plan":
            return value
        return AugmentSchedule(value, min_visibility=self.min_visibility, check=self._check).plan_for(epoch)

    # -- resuming ---------------------------------------------------------------------------------

    def state(self, fresh: bool, epoch: int) -> dict:
        """What a loader's state keeps: the spec of the saved epoch's plan (``augment``), and of the
        one ``set`` asked for after it (``augment_next``); None where a plan cannot be written."""
        plan = self.upcoming(epoch) if fresh else self.plan_for(epoch)
        state = {"augment": format_spec(plan.listed if plan is not None else None)}
        if state["augment"] is None and self._function is None:
            log.warning(
                "state_dict: epoch %d's transforms cannot be written as text; a loader resumed from "
                "this state reads the rest of the epoch with the transforms it was made with",
                epoch,
            )
        with self._lock:
            pending, later = self._pending, not fresh or self._hold
        if later and pending is not _UNSET and pending[0] == "plan":
            nxt = pending[1]
            state["augment_next"] = format_spec(nxt.listed if nxt is not None else None)
        return state

    def _user_ops(self) -> dict:
        """The user's own ops this loader was given (and asked for by ``set``), by their text."""
        plans = [self._current]
        with self._lock:
            if self._pending is not _UNSET and self._pending[0] == "plan":
                plans.append(self._pending[1])
        return {s.spec_text(): s for p in plans if p is not None for s in p.listed if hasattr(s, "spec_text")}

    @staticmethod
    def check_state(state: dict) -> None:
        """One line for a state whose plans are not text (``restore`` would pass them over)."""
        for key in ("augment", "augment_next"):  # None: not written (a warning said so when saved)
            if state.get(key) is not None and not isinstance(state[key], str):
                raise ValueError(
                    f"this state's {key} is a {type(state[key]).__name__}, not a list of transforms as "
                    "text: it was not written by state_dict"
                )

    def restore(self, state: dict, *, new_epoch: bool) -> None:
        """Resume with a saved state's plans (a function of the epoch needs none: it is asked again).

        ``new_epoch``: the saved epoch was over, so the resumed pass is the next one, which reads
        with the plan ``set`` had asked for, if any.
        """
        self.check_state(state)
        if self._function is not None or not isinstance(state.get("augment"), str):
            return
        ops = self._user_ops()
        saved = self.compile(parse_spec(state["augment"], ops=ops))
        following = state.get("augment_next")
        after = self.compile(parse_spec(following, ops=ops)) if isinstance(following, str) else _UNSET
        given = self._current.listed if self._current is not None else ()
        if ops and format_spec(given) not in (state["augment"], following):
            raise AugmentUsageError(
                f"augment: this loader was given {', '.join(ops)}, and the state it resumes read its epoch "
                f"with {state['augment'] or 'no augmentation'}: a loader resumed from a state is made with "
                "the same augment list"
            )
        with self._lock:
            if new_epoch and after is not _UNSET:
                self._install(("plan", after))
                self._pending, self._hold = _UNSET, False
            else:
                self._install(("plan", saved))
                self._pending = _UNSET if after is _UNSET else ("plan", after)
                self._hold = after is not _UNSET
