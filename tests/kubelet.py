"""A ConfigMap or Secret volume written exactly as kubelet writes it, for the
tests of live reload: the files a pod sees are symlinks through ``..data``, and
an update never touches them (shared by the file watcher's unit tests and the
proxy's reload tests)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path


class ConfigMapDir:
    """A mounted ConfigMap (or Secret: the same layout) as kubelet's AtomicWriter keeps it::

        DIR/config.yaml -> ..data/config.yaml
        DIR/..data -> ..2026_11_23_10_15_42.000000001
        DIR/..2026_11_23_10_15_42.000000001/config.yaml

    ``update`` writes a new timestamped directory, points ``..data_tmp`` at it, renames
    that over ``..data`` (the one atomic step) and removes the old directory."""

    def __init__(self, root: Path, files: dict[str, bytes] | None = None) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._generation = 0
        if files is not None:
            self.update(files)

    def path(self, name: str) -> str:
        return str(self.root / name)

    def update(self, files: dict[str, bytes]) -> None:
        self._generation += 1
        stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())
        new_dir = self.root / f"..{stamp}.{self._generation:09d}"
        new_dir.mkdir()
        for name, data in files.items():
            (new_dir / name).write_bytes(data)
        data_link = self.root / "..data"
        old_dir = self.root / os.readlink(data_link) if data_link.is_symlink() else None
        for name in files:  # user-visible names point through ..data, created once
            visible = self.root / name
            if not visible.is_symlink():
                visible.symlink_to(Path("..data") / name)
        tmp_link = self.root / "..data_tmp"
        tmp_link.symlink_to(new_dir.name)
        os.rename(tmp_link, data_link)  # the atomic swap
        if old_dir is not None:
            shutil.rmtree(old_dir)
