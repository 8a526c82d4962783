"""How many worker processes ``workers: auto`` means: the CPUs this process may run on
(its affinity mask, as ``taskset`` or a cpuset sets it), capped by the cgroup's CPU
quota (what a container's CPU limit or systemd's CPUQuota= becomes): cgroup v2's
``cpu.max``, or cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``. More processes
than that only take turns on the same cores."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def cgroup_cpu_quota(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs the cgroup quota allows (quota / period, may be fractional), the smallest
    along the path from this process's cgroup up to the root of its hierarchy, in cgroup v2
    and v1 alike (a hybrid host has both); None when no quota is set."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for hierarchy, controllers, path in (line.split(":", 2) for line in lines if line.count(":") >= 2):
        if hierarchy == "0" and controllers == "":  # v2: one unified hierarchy
            quotas += _along(root, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # v1: the hierarchy of the cpu controller
            mount = next((root / name for name in (controllers, "cpu") if (root / name).is_dir()), None)
            if mount is not None:
                quotas += _along(mount, path, _v1_quota)
    return min(quotas, default=None)


def _along(mount: Path, path: str, read: Callable[[Path], float | None]) -> Iterator[float]:
    """Each quota from the process's cgroup directory up to the mount point. In a container
    the mount may be its own cgroup while ``path`` is the host's: the directories that do
    not exist are passed over, up to the mount."""
    directory = mount / path.lstrip("/")
    while True:
        quota = read(directory)
        if quota is not None:
            yield quota
        if directory == mount or mount not in directory.parents:
            return
        directory = directory.parent


def _v2_quota(directory: Path) -> float | None:
    """``cpu.max``: "<quota> <period>" in microseconds, or "max <period>"."""
    try:
        quota, period = (directory / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(directory: Path) -> float | None:
    """``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def available_cpus(affinity: int | None = None, proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may use: its affinity, capped by the cgroup quota rounded up
    (a limit of 1.5 CPUs is served best by 2 workers), at least 1."""
    cpus = len(os.sched_getaffinity(0)) if affinity is None else affinity
    quota = cgroup_cpu_quota(proc_cgroup, root)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def worker_count(workers: int | Literal["auto"]) -> int:
    """The ``workers`` setting as a number of processes."""
    return available_cpus() if workers == "auto" else workers
