"""Watch the config, certificate, key and CA files, and say when they changed.

Kubernetes updates a mounted ConfigMap or Secret without touching the file a
pod opened: kubelet writes a new timestamped directory, points a temporary
symlink at it and renames that over the ``..data`` symlink, so ``config.yaml``
(itself a symlink to ``..data/config.yaml``) resolves to a new file at once.
inotify on the file's name sees nothing, so each file is polled: its resolved
path, device, inode, size and mtime (a rename over it, an edit in place and the
symlink swap all change one of them). A change is reported once the files have
stayed unchanged for ``settle`` seconds, so a certificate and its key replaced
one after the other arrive as one change.

Wiring (the server's reload)::

    watcher = FileWatcher([config_path, *certificate_files(config.tls_files())], on_change)
    await nursery.start(watcher.run)
    # on_change(paths): reload; then watcher.set_paths([config_path, *certificate_files(new.tls_files())])
    # a reload by SIGHUP first calls watcher.mark_read(), so the watcher does not reload the same files again
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio

__all__ = ["FileStamp", "FileWatcher", "stamp_of"]

log = logging.getLogger("kafka_admission_proxy.file_watch")

OnChange = Callable[[frozenset[str]], Awaitable[None]]


@dataclass(frozen=True)
class FileStamp:
    """What identifies one version of a file; ``None`` fields: the file is missing."""

    realpath: str
    device: int | None
    inode: int | None
    size: int | None
    mtime_ns: int | None


def stamp_of(path: str) -> FileStamp:
    realpath = os.path.realpath(path)
    try:
        st = os.stat(realpath)
    except OSError:
        return FileStamp(realpath, None, None, None, None)
    return FileStamp(realpath, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class FileWatcher:
    """``await nursery.start(watcher.run)``; ``on_change(paths)`` is awaited with the
    watched paths (as given) that changed, one call at a time, never concurrently."""

    def __init__(
        self, paths: Iterable[str], on_change: OnChange, *, interval: float = 1.0, settle: float = 1.0
    ) -> None:
        self._on_change = on_change
        self.interval = interval
        self.settle = settle
        self._stamps: dict[str, FileStamp] = {}
        self.set_paths(paths)

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(self._stamps)

    def set_paths(self, paths: Iterable[str]) -> None:
        """Watch these paths from now on (after a reload named other certificate files).
        Paths already watched keep their last stamp; new ones start from what is there now."""
        wanted = set(paths)
        self._stamps = {p: self._stamps.get(p) or stamp_of(p) for p in sorted(wanted)}

    def mark_read(self) -> None:
        """The files as they are now are being read (a reload by SIGHUP): report only later
        changes, not one the reload takes in (also when it is settling right now)."""
        self._stamps = self._snapshot()

    def _snapshot(self) -> dict[str, FileStamp]:
        return {path: stamp_of(path) for path in self._stamps}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            if self._snapshot() != self._stamps:
                changed = await self._settled_changes()
                if changed:
                    log.info("watched files changed", extra={"files": ",".join(sorted(changed))})
                    await self._on_change(changed)

    async def _settled_changes(self) -> frozenset[str]:
        """Wait until no watched file has moved for ``settle`` seconds, then take the
        files that differ from the last report as reported."""
        seen = self._snapshot()
        while True:
            await trio.sleep(self.settle)
            now = self._snapshot()
            if now == seen:
                break
            seen = now
        changed = frozenset(p for p, stamp in seen.items() if p in self._stamps and self._stamps[p] != stamp)
        for path in changed:
            self._stamps[path] = seen[path]
        return changed
