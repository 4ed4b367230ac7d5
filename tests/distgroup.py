"""A gloo group for tests whose ranks are spawned processes, met through a file, never a TCP port.

A port picked by binding to 0 and closing is free again until rank 0 binds it seconds later (ranks
import torch first): any process may take it meanwhile, and so may the other ranks themselves, whose
repeated connection attempts to a port nobody listens on yet use ports of the same ephemeral range
(on Linux a connection from port P to 127.0.0.1:P connects to itself). Rank 0 then fails to listen
("address already in use") or a rank talks to itself; under load the window is long enough to be hit.
A rendezvous file in the test's own folder has no such window.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["join_group", "rendezvous"]


def rendezvous(folder: Path) -> str:
    """The ``init_method`` every rank of one group passes: a file not yet made, in the test's folder."""
    path = Path(folder) / "rendezvous"
    assert not path.exists(), "one group per rendezvous file"
    return f"file://{path}"


def join_group(rank: int, world: int, init_method: str) -> None:
    """Join the gloo group of ``world`` ranks that meet at ``init_method`` (from ``rendezvous``)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
