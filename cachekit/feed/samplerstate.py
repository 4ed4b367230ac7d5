"""A sampler's saved state: what it holds (``state_of``, versioned), and what a state must show before
a sampler resumes from it (the same cache, the same order, a valid epoch and world size), each refusal
one line.

Which of a state's settings a sampler adopts (a seed it chose itself, its default partitions) is
decided here too; the sampler changes only after every check has passed.
"""

from __future__ import annotations

from ..constants import MAX_EPOCH

__all__ = [
    "STATE_VERSION",
    "check_saved_cache",
    "adopted_partitions",
    "adopted_seed",
    "check_same_order",
    "saved_epoch_and_world",
    "state_of",
    "shown",
    "is_count",
]

#: 3: blocks of whole shards, node partitions of fixed samples; 4: samples permuted within a block by
#: a keyed permutation (the same blocks, another order inside them: a version 3 state would resume
#: its interrupted block on other samples, so it is refused)
STATE_VERSION = 4


def state_of(sampler, position: int) -> dict:
    """What a ``ShardAwareDistributedSampler`` saves: its epoch, the global ``position`` reached in it,
    and every setting its order depends on (``load_state_dict`` checks them)."""
    return {
        "version": STATE_VERSION,
        "epoch": sampler.epoch,
        "position": position,
        "seed": sampler.seed,
        "shuffle": sampler.shuffle,
        "window": sampler.window,
        "group_size": sampler.group_size,
        "partitions": sampler.partitions,
        "group_spread": sampler.group_spread,
        "drop_last": sampler.drop_last,
        "num_replicas": sampler.num_replicas,
        "num_samples": sampler.dataset_len,
        "fingerprint": sampler.fingerprint,
    }


def shown(value) -> str:
    """``repr(value)`` cut short (a state may hold anything)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def is_count(value) -> bool:
    """An int that is not a bool (a state read back from JSON or a checkpoint)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_saved_cache(state, fingerprint: str | None, dataset_len: int) -> None:
    """Refuse a state of another version, or saved on another cache (or one of another length)."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(
            "sampler state is not from this version of cachekit (it has no global position); "
            "start the epoch again"
        )
    saved = state.get("fingerprint")
    if fingerprint and (not isinstance(saved, str) or not saved):
        raise ValueError(
            "sampler state names no cache (its fingerprint is missing or empty): it cannot be "
            "told from a state of another cache of the same length; resume from a state_dict() "
            "this version of cachekit saved"
        )
    if fingerprint and saved != fingerprint:
        raise ValueError(
            "sampler state was saved on another cache (its fingerprint differs): the same "
            "position would be other samples; resume on the cache it was saved with"
        )
    if state.get("num_samples") != dataset_len:
        raise ValueError(
            f"sampler state is for a dataset of {shown(state.get('num_samples'))} samples, not {dataset_len}"
        )


def adopted_partitions(state: dict, own_partitions: int | None, partitions: int) -> int | None:
    """The saved job's partitions, resumed for this epoch (another number of nodes), where this
    sampler's are its default (``own_partitions``), not the user's choice; None: keep its own."""
    saved = state.get("partitions")
    if own_partitions is not None and is_count(saved) and saved >= 1 and saved != partitions:
        return saved
    return None


def adopted_seed(state: dict, seed_chosen: bool) -> int | None:
    """The saved job's seed, where this sampler's was chosen for the user (``make_loader``'s
    ``seed=None``): its order and crops continue; None: keep its own."""
    saved = state.get("seed")
    if seed_chosen and is_count(saved) and 0 <= saved < 2**63:
        return int(saved)
    return None


def check_same_order(state: dict, mine: dict) -> None:
    """Refuse a state whose order settings (``mine``: the sampler's, as it would resume) differ."""
    differ = [f"{k}={state.get(k)!r} (here {v!r})" for k, v in mine.items() if state.get(k) != v]
    if differ:
        hint = "; pass the saved values to the sampler (make_loader: seed=, window=, partitions=, batch_size)"
        raise ValueError(f"sampler state has another order: {', '.join(differ)}{hint}")


def saved_epoch_and_world(state: dict) -> tuple[int, int]:
    """The saved epoch and world size, refused in one line unless both are valid."""
    world, epoch = state.get("num_replicas"), state.get("epoch")
    if not is_count(world) or world < 1 or not is_count(epoch) or not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(
            f"sampler state has no valid epoch (0 to {MAX_EPOCH}) or world size: {shown(epoch)}, {shown(world)}"
        )
    return epoch, world
