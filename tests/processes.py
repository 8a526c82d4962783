"""The processes of a proxy under test, read from /proc: one process, or with ``workers: N``
a supervisor (which serves no client) and its N workers. Memory checks add up every one of
them, so that a bound on the proxy's memory holds for its workers too."""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces): state, parent id..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from the parent ids in /proc (zombies included)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat_fields(int(entry.name))[1])
            except OSError:
                continue  # exited meanwhile
    tree = [pid]
    for parent in tree:
        tree.extend(child for child, ppid in parents.items() if ppid == parent)
    return tree


def living(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (not exited, nor exited and not yet reaped), sorted."""
    alive = []
    for pid in pids:
        try:
            state = _stat_fields(pid)[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return sorted(alive)


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for process {pid}")


def rss_kib(pid: int) -> int:
    """Resident memory of one process."""
    return _status_kib(pid, "VmRSS")


def peak_rss_kib(pid: int) -> int:
    """The peak of one process's resident memory so far (VmHWM): catches what is held only for an instant."""
    return _status_kib(pid, "VmHWM")
