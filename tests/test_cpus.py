"""CPUs a process may use: affinity, cgroup v1/v2 quotas up the hierarchy, ranks sharing a node."""

from __future__ import annotations

import os

import pytest

from cachekit import cpus, suggest_num_workers
from cachekit.feed.loader import suggest_threads


@pytest.fixture
def fake_cgroup(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    root.mkdir()
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/\n")
    monkeypatch.setattr(cpus, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(cpus, "PROC_CGROUP", str(proc))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    return root


def test_cpus_follow_affinity_without_a_quota(fake_cgroup):
    (fake_cgroup / "cpu.max").write_text("max 100000\n")
    assert cpus.available_cpus() == 8


def test_cgroup_v2_quota_caps_the_cpus(fake_cgroup):
    (fake_cgroup / "cpu.max").write_text("250000 100000\n")  # 2.5 CPUs
    assert cpus.available_cpus() == 3
    assert suggest_num_workers(64) == 3
    assert suggest_num_workers(64, world_size=2) == 1
    assert suggest_num_workers(64, max_workers=2) == 2
    assert suggest_num_workers(1) == 0


def test_cgroup_v2_quota_of_the_process_own_group(fake_cgroup, tmp_path):
    (tmp_path / "proc_cgroup").write_text("0::/kubepods/pod1\n")
    (fake_cgroup / "kubepods" / "pod1").mkdir(parents=True)
    (fake_cgroup / "kubepods" / "pod1" / "cpu.max").write_text("100000 100000\n")
    assert cpus.available_cpus() == 1


def test_cgroup_v1_quota_caps_the_cpus(fake_cgroup):
    (fake_cgroup / "cpu").mkdir()
    (fake_cgroup / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (fake_cgroup / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus.available_cpus() == 4
    (fake_cgroup / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert cpus.available_cpus() == 8


def test_the_smallest_quota_up_the_v2_hierarchy_applies(fake_cgroup, tmp_path):
    (tmp_path / "proc_cgroup").write_text("0::/kubepods/burstable/pod1/ctr\n")
    own = fake_cgroup / "kubepods" / "burstable" / "pod1" / "ctr"
    own.mkdir(parents=True)
    (own / "cpu.max").write_text("max 100000\n")  # the container itself: unlimited
    (own.parent / "cpu.max").write_text("300000 100000\n")  # its pod: 3 CPUs
    (own.parent.parent / "cpu.max").write_text("600000 100000\n")
    assert cpus.cgroup_cpu_limit() == 3.0 and cpus.available_cpus() == 3


def test_the_smallest_quota_up_the_v1_hierarchy_applies(fake_cgroup, tmp_path):
    (tmp_path / "proc_cgroup").write_text("4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")
    mount = fake_cgroup / "cpu,cpuacct"
    own = mount / "docker" / "abc"
    own.mkdir(parents=True)
    (own / "cpu.cfs_quota_us").write_text("-1\n")
    (own / "cpu.cfs_period_us").write_text("100000\n")
    (own.parent / "cpu.cfs_quota_us").write_text("150000\n")  # docker's parent group: 1.5 CPUs
    (own.parent / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus.cgroup_cpu_limit() == 1.5 and cpus.available_cpus() == 2


def test_ranks_on_this_node_share_its_cpus(fake_cgroup, monkeypatch):
    (fake_cgroup / "cpu.max").write_text("max 100000\n")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert cpus.local_world_size() == 4
    assert suggest_num_workers(64) == 2 and suggest_threads() == 2  # 8 CPUs over 4 ranks
    monkeypatch.setenv("WORLD_SIZE", "64")  # the job's global size does not matter
    assert suggest_num_workers(64) == 2
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert cpus.local_world_size() == 1 and suggest_threads() == 8
