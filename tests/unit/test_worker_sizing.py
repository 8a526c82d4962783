"""``workers: auto`` (proxy/workers/sizing.py): the CPUs the process may use, capped by
the cgroup v2 CPU quota along its cgroup's path."""

from __future__ import annotations

import os
from pathlib import Path

from proxy.workers.sizing import cgroup_cpu_quota, worker_count


def cgroups(tmp_path: Path, path: str, quotas: dict[str, str]) -> tuple[Path, Path]:
    """A /proc/self/cgroup naming ``path`` and a cgroup tree with ``cpu.max`` at ``quotas``' directories."""
    root = tmp_path / "cgroup"
    for directory, text in quotas.items():
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / "cpu.max").write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{path}\n")
    return proc, root


def test_a_quota_of_one_and_a_half_cpus_is_read_as_such(tmp_path: Path) -> None:
    proc, root = cgroups(tmp_path, "/pod/proxy", {"pod/proxy": "150000 100000\n"})
    assert cgroup_cpu_quota(proc, root) == 1.5


def test_the_smallest_quota_along_the_path_counts(tmp_path: Path) -> None:
    proc, root = cgroups(tmp_path, "/pod/proxy", {"pod": "200000 100000", "pod/proxy": "max 100000"})
    assert cgroup_cpu_quota(proc, root) == 2.0


def test_no_quota_anywhere_is_none(tmp_path: Path) -> None:
    proc, root = cgroups(tmp_path, "/", {".": "max 100000"})
    assert cgroup_cpu_quota(proc, root) is None
    assert cgroup_cpu_quota(tmp_path / "missing", root) is None  # cgroup v1 or no /proc


def test_auto_is_at_most_the_cpus_of_the_affinity_mask_and_a_number_is_itself() -> None:
    assert 1 <= worker_count("auto") <= len(os.sched_getaffinity(0))
    assert worker_count(3) == 3
