"""A real filesystem whose writes can be stalled: a FUSE mount (libfuse 3 through
mfusepy) passing every operation through to a backing directory, except that
``write`` waits while the mount is stalled. A process writing there blocks in the
kernel exactly as on a disk that stopped answering; nothing in that process is
patched or told. (This is the one stand-in: no real disk can be stalled on demand.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

FUSERMOUNT = "fusermount3"


def _available() -> str | None:
    """Why a FUSE mount cannot be made here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which(FUSERMOUNT) is None:
        return "no fusermount3 (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse: {exc}"
    return None


class StalledFilesystem:
    """``mount`` over ``backing``; ``stall()`` holds every write until ``resume()``."""

    def __init__(self, backing: Path, mount: Path) -> None:
        why = _available()
        if why is not None:
            pytest.skip(f"a stallable filesystem needs FUSE: {why}")
        self.backing, self.mount = backing, mount
        backing.mkdir(parents=True, exist_ok=True)
        mount.mkdir(parents=True, exist_ok=True)
        self._open = threading.Event()
        self._open.set()
        self.writes_held = 0
        self._thread: threading.Thread | None = None

    def stall(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def __enter__(self) -> StalledFilesystem:
        import mfusepy

        self._thread = threading.Thread(
            target=mfusepy.FUSE, args=(_Passthrough(self), str(self.mount)), kwargs={"foreground": True}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not os.path.ismount(self.mount):
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise AssertionError(f"FUSE mount at {self.mount} did not come up")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.resume()
        subprocess.run([FUSERMOUNT, "-u", "-z", str(self.mount)], check=False, capture_output=True)
        if self._thread is not None:
            self._thread.join(10)


def _operations() -> type:
    import mfusepy

    return mfusepy.Operations  # type: ignore[no-any-return]


class _Passthrough(_operations() if _available() is None else object):  # type: ignore[misc]
    use_ns = True

    def __init__(self, fs: StalledFilesystem) -> None:
        self._fs = fs

    def _path(self, path: str) -> str:
        return os.path.join(self._fs.backing, path.lstrip("/"))

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        st = os.lstat(self._path(path))
        names = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
        return {name: getattr(st, name) for name in names}

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._path(path))]

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        return os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)

    def open(self, path: str, flags: int) -> int:
        return os.open(self._path(path), flags)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        if not self._fs._open.is_set():
            self._fs.writes_held += 1
            self._fs._open.wait()
        return os.pwrite(fh, data, offset)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        os.fsync(fh)
        return 0

    def rename(self, old: str, new: str) -> int:
        os.rename(self._path(old), self._path(new))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._path(path))
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._path(path), mode)
        return 0

    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        os.truncate(self._path(path), length)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._fs.backing)
        names = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize")
        return {name: getattr(st, name) for name in names}
