"""A gloo group for tests whose ranks are spawned processes, met through a file, never a TCP port.

A port picked by binding to 0 and closing is free again until rank 0 binds it seconds later (ranks
import torch first): any process may take it meanwhile, and so may the other ranks themselves, whose
repeated connection attempts to a port nobody listens on yet use ports of the same ephemeral range
(on Linux a connection from port P to 127.0.0.1:P connects to itself). Rank 0 then fails to listen
("address already in use") or a rank talks to itself; under load the window is long enough to be hit.
A rendezvous file in the test's own folder has no such window.

Gloo's own connections between the ranks (``connectFullMesh``) are still TCP, on ports the system
hands out; under load one of them is sometimes closed by its peer while the mesh is being made
("Connection closed by peer"). ``join_group`` then starts the whole group again, every rank at a
fresh rendezvous file (the next try's), a bounded number of times, and fails in one line otherwise.
"""

from __future__ import annotations

import datetime
from pathlib import Path

__all__ = ["join_group", "rendezvous", "GROUP_TRIES"]

#: Starts of a whole group before a test gives up.
GROUP_TRIES = 4

#: What gloo says when a connection of its mesh fails while the group starts: worth another try.
_TRANSIENT = ("connectFullMesh", "Connection closed by peer", "Connection reset by peer")


def rendezvous(folder: Path) -> str:
    """The ``init_method`` every rank of one group passes: a file not yet made, in the test's folder."""
    path = Path(folder) / "rendezvous"
    assert not path.exists(), "one group per rendezvous file"
    return f"file://{path}"


def join_group(rank: int, world: int, init_method: str, tries: int = GROUP_TRIES) -> None:
    """Join the gloo group of ``world`` ranks that meet at ``init_method`` (from ``rendezvous``).

    The group has started once every rank has passed a barrier in it. When gloo's mesh fails to
    connect (or a peer failed to, so the barrier fails), every rank leaves the half-made group and
    meets again at try ``t``'s rendezvous (``init_method`` with ``-t`` added): all ranks fail the same
    try, so they all move on together. Any other error is raised at once; after ``tries`` starts, a
    ``RuntimeError`` says so in one line.
    """
    import torch.distributed as dist

    last = ""
    for t in range(tries):
        where = init_method if t == 0 else f"{init_method}-{t}"
        try:
            dist.init_process_group("gloo", init_method=where, rank=rank, world_size=world)
        except RuntimeError as e:
            if not any(s in str(e) for s in _TRANSIENT):
                raise
            last = str(e).splitlines()[0] if str(e) else type(e).__name__
            continue
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=120), wait_all_ranks=True)
            return
        except RuntimeError as e:  # a peer's mesh failed: it is starting again, at the next try
            last = str(e).splitlines()[0] if str(e) else type(e).__name__
            dist.destroy_process_group()
    raise RuntimeError(f"a gloo group of {world} ranks did not start in {tries} tries (rank {rank}): {last}")
