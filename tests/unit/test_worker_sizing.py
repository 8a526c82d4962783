"""``workers: auto`` (proxy/workers/sizing.py): the CPUs this process may use, capped by the
cgroup's CPU quota, read from real files laid out as the kernel lays them out (cgroup v2's
``cpu.max``, cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), in a temporary tree
passed in place of /proc/self/cgroup and /sys/fs/cgroup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.workers.sizing import available_cpus, cgroup_cpu_quota, worker_count


def v2(tmp_path: Path, own: str, limits: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup v2 tree: this process in cgroup ``own``; ``cpu.max`` written where given."""
    root = tmp_path / "sys-fs-cgroup"
    (root / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for directory, cpu_max in limits.items():
        (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / directory.lstrip("/") / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{own}\n")
    return proc, root


def v1(tmp_path: Path, own: str, limits: dict[str, tuple[int, int]], mount: str = "cpu,cpuacct") -> tuple[Path, Path]:
    """A cgroup v1 host: the cpu controller's hierarchy mounted at ``mount``, a unified
    hierarchy without it (a hybrid host), this process in ``own``."""
    root = tmp_path / "sys-fs-cgroup"
    cpu = root / mount
    (cpu / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "memory" / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "unified").mkdir(parents=True, exist_ok=True)
    for directory, (quota, period) in limits.items():
        (cpu / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (cpu / directory.lstrip("/") / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (cpu / directory.lstrip("/") / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"12:memory:{own}\n4:{mount}:{own}\n1:name=systemd:{own}\n0::{own}\n")
    return proc, root


@pytest.mark.parametrize(
    ("cpu_max", "quota", "workers"),
    [
        ("400000 100000", 4.0, 4),  # limits.cpu: 4
        ("150000 100000", 1.5, 2),  # a fractional quota is served by the next whole worker
        ("50000 100000", 0.5, 1),  # under one CPU: still one worker
        ("250000 50000", 5.0, 5),  # another period
        ("max 100000", None, 8),  # no quota: the affinity
    ],
)
def test_cgroup_v2_cpu_max_caps_the_cpus_rounded_up_at_least_one(
    tmp_path: Path, cpu_max: str, quota: float | None, workers: int
) -> None:
    proc, root = v2(tmp_path, "/kubepods.slice/pod1/proxy", {"/kubepods.slice/pod1/proxy": cpu_max})
    assert cgroup_cpu_quota(proc, root) == quota
    assert available_cpus(8, proc, root) == workers


def test_cgroup_v2_the_smallest_quota_on_the_way_up_counts(tmp_path: Path) -> None:
    """systemd's CPUQuota= on a slice limits every service under it."""
    proc, root = v2(
        tmp_path,
        "/system.slice/kafka-admission-proxy.service",
        {"/system.slice": "200000 100000", "/system.slice/kafka-admission-proxy.service": "300000 100000"},
    )
    assert cgroup_cpu_quota(proc, root) == 2.0
    assert available_cpus(16, proc, root) == 2


def test_cgroup_v2_in_a_container_reads_the_namespace_root(tmp_path: Path) -> None:
    """A container with its own cgroup namespace sees ``0::/`` and its limit at the root."""
    proc, root = v2(tmp_path, "/", {"/": "300000 100000"})
    assert available_cpus(64, proc, root) == 3


def test_the_affinity_caps_a_larger_quota(tmp_path: Path) -> None:
    proc, root = v2(tmp_path, "/a", {"/a": "800000 100000"})
    assert available_cpus(2, proc, root) == 2


@pytest.mark.parametrize(
    ("quota_us", "period_us", "quota", "workers"),
    [
        (200000, 100000, 2.0, 2),
        (250000, 100000, 2.5, 3),
        (30000, 100000, 0.3, 1),
        (-1, 100000, None, 6),  # -1: no quota
    ],
)
def test_cgroup_v1_cfs_quota_caps_the_cpus_rounded_up_at_least_one(
    tmp_path: Path, quota_us: int, period_us: int, quota: float | None, workers: int
) -> None:
    proc, root = v1(tmp_path, "/docker/abc123", {"/docker/abc123": (quota_us, period_us)})
    assert cgroup_cpu_quota(proc, root) == quota
    assert available_cpus(6, proc, root) == workers


def test_cgroup_v1_with_the_hosts_path_inside_a_container_reads_the_mount(tmp_path: Path) -> None:
    """Without a cgroup namespace a container reads the host's path in /proc/self/cgroup,
    while its cpu hierarchy is mounted at its own cgroup: the quota is at the mount."""
    proc, root = v1(tmp_path, "/", {"/": (150000, 100000)}, mount="cpu")
    proc.write_text("4:cpu:/kubepods/burstable/pod9/c0ffee\n0::/\n")
    assert cgroup_cpu_quota(proc, root) == 1.5
    assert available_cpus(4, proc, root) == 2


def test_no_quota_anywhere_or_no_cgroup_files_means_the_affinity(tmp_path: Path) -> None:
    proc, root = v2(tmp_path, "/", {"/": "max 100000"})
    assert cgroup_cpu_quota(proc, root) is None
    assert cgroup_cpu_quota(tmp_path / "absent", root) is None  # no /proc
    assert available_cpus(3, tmp_path / "absent", root) == 3


def test_auto_is_at_most_the_cpus_of_the_affinity_mask_and_a_number_is_itself() -> None:
    assert 1 <= worker_count("auto") <= len(os.sched_getaffinity(0))
    assert worker_count(3) == 3
