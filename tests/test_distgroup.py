"""The tests' gloo group helper: a group whose mesh fails to connect is started again, boundedly."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from distgroup import GROUP_TRIES, join_group, rendezvous

_MESH = "[enforce fail at gloo/transport/tcp/pair.cc:446] Gloo connectFullMesh failed with Connection closed by peer"


def _failing_first(monkeypatch, errors: list[str]) -> list[str]:
    """``init_process_group`` raising ``errors`` in turn, then the real one; the rendezvous of each try."""
    real, seen = dist.init_process_group, []

    def init(backend, init_method, rank, world_size):
        seen.append(init_method)
        if len(seen) <= len(errors):
            raise RuntimeError(errors[len(seen) - 1])
        real(backend, init_method=init_method, rank=rank, world_size=world_size)

    monkeypatch.setattr(dist, "init_process_group", init)
    return seen


def test_a_mesh_that_fails_to_connect_is_started_again_at_a_fresh_rendezvous(monkeypatch, tmp_path):
    seen = _failing_first(monkeypatch, [_MESH, _MESH])
    join_group(0, 1, rendezvous(tmp_path))
    try:
        assert dist.is_initialized() and dist.get_world_size() == 1
        assert len(seen) == 3 and len(set(seen)) == 3  # each try meets at its own file
        assert seen[0] == f"file://{tmp_path / 'rendezvous'}"
    finally:
        dist.destroy_process_group()


def test_other_errors_are_raised_at_once_and_a_mesh_that_never_connects_says_so(monkeypatch, tmp_path):
    seen = _failing_first(monkeypatch, ["Address family not supported"])
    with pytest.raises(RuntimeError, match="Address family"):
        join_group(0, 1, rendezvous(tmp_path))
    assert len(seen) == 1 and not dist.is_initialized()
    seen = _failing_first(monkeypatch, [_MESH] * GROUP_TRIES)
    with pytest.raises(RuntimeError, match=rf"did not start in {GROUP_TRIES} tries .*connectFullMesh"):
        join_group(0, 1, f"file://{tmp_path / 'again'}")
    assert len(seen) == GROUP_TRIES and not dist.is_initialized()
