"""How many worker processes ``workers: auto`` means: the CPUs this process may run on
(its affinity mask, as ``taskset`` or a cpuset sets it), capped by the cgroup v2 CPU
quota (``cpu.max``, what a container's CPU limit or systemd's CPUQuota= becomes).
More processes than that only take turns on the same cores."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs the cgroup v2 quota allows (quota / period), the smallest along the path from
    this process's cgroup up to the root; None when no ``cpu.max`` sets one."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), "/")
    directory = root / path.lstrip("/")
    quotas = []
    while True:
        try:
            quota, period = (directory / "cpu.max").read_text().split()
        except (OSError, ValueError):
            pass
        else:
            if quota != "max":
                quotas.append(int(quota) / int(period))
        if directory == root or root not in directory.parents:
            break
        directory = directory.parent
    return min(quotas, default=None)


def available_cpus() -> int:
    """The CPUs this process may use: its affinity, capped by the cgroup quota (rounded up:
    a limit of 1.5 CPUs is served best by 2 workers)."""
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def worker_count(workers: int | Literal["auto"]) -> int:
    """The ``workers`` setting as a number of processes."""
    return available_cpus() if workers == "auto" else workers
