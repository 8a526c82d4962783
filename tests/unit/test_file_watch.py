"""The file watcher sees ConfigMap and Secret updates made exactly as kubelet
makes them (a new timestamped directory, a ``..data_tmp`` symlink renamed over
``..data``), edits in place and renames over a file, and reports each change
once after it settles. Real files and symlinks; trio's autojump clock skips the
waiting."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from proxy.serve.file_watch import FileWatcher
from tests.kubelet import ConfigMapDir


class Calls:
    def __init__(self) -> None:
        self.changes: list[frozenset[str]] = []

    async def __call__(self, paths: frozenset[str]) -> None:
        self.changes.append(paths)


async def watch(watcher: FileWatcher, nursery: trio.Nursery) -> None:
    await nursery.start(watcher.run)


async def test_a_configmap_update_by_symlink_swap_is_reported_once(tmp_path: Path, autojump_clock: object) -> None:
    volume = ConfigMapDir(tmp_path / "config", {"config.yaml": b"policies: {}\n"})
    calls = Calls()
    async with trio.open_nursery() as nursery:
        await watch(FileWatcher([volume.path("config.yaml")], calls), nursery)
        await trio.sleep(5)
        assert calls.changes == []
        volume.update({"config.yaml": b"policies: {group.max.size: 2}\n"})
        await trio.sleep(10)
        assert calls.changes == [frozenset({volume.path("config.yaml")})]
        volume.update({"config.yaml": b"policies: {group.max.size: 3}\n"})
        await trio.sleep(10)
        assert len(calls.changes) == 2
        nursery.cancel_scope.cancel()


async def test_a_swap_with_the_same_size_and_mtime_is_still_seen(tmp_path: Path, autojump_clock: object) -> None:
    volume = ConfigMapDir(tmp_path / "config", {"config.yaml": b"a: 1\n"})
    before = os.stat(volume.path("config.yaml"))
    calls = Calls()
    async with trio.open_nursery() as nursery:
        await watch(FileWatcher([volume.path("config.yaml")], calls), nursery)
        volume.update({"config.yaml": b"a: 2\n"})
        os.utime(volume.path("config.yaml"), ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.stat(volume.path("config.yaml"))
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        await trio.sleep(10)
        assert calls.changes == [frozenset({volume.path("config.yaml")})]
        nursery.cancel_scope.cancel()


async def test_a_secret_rotation_of_certificate_and_key_arrives_as_one_change(
    tmp_path: Path, autojump_clock: object
) -> None:
    volume = ConfigMapDir(tmp_path / "tls", {"tls.crt": b"cert 1", "tls.key": b"key 1", "ca.crt": b"ca"})
    calls = Calls()
    watched = [volume.path("tls.crt"), volume.path("tls.key"), volume.path("ca.crt")]
    async with trio.open_nursery() as nursery:
        await watch(FileWatcher(watched, calls), nursery)
        volume.update({"tls.crt": b"cert 2", "tls.key": b"key 2", "ca.crt": b"ca"})
        await trio.sleep(10)
        # The CA's content is the same, but kubelet wrote it anew: every file of the swap is named.
        assert calls.changes == [frozenset(watched)]
        nursery.cancel_scope.cancel()


async def test_files_replaced_one_after_the_other_are_debounced_into_one_change(
    tmp_path: Path, autojump_clock: object
) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_text("cert 1")
    key.write_text("key 1")
    calls = Calls()
    async with trio.open_nursery() as nursery:
        await watch(FileWatcher([str(cert), str(key)], calls, interval=1.0, settle=1.0), nursery)
        await trio.sleep(1.5)
        # An operator (or cert-manager's csi driver) writes the certificate, then the key.
        for name, path, text in (("new.pem", cert, "cert 2"), ("new.key", key, "key 2")):
            (tmp_path / name).write_text(text)
            os.rename(tmp_path / name, path)
            await trio.sleep(0.6)
        await trio.sleep(10)
        assert calls.changes == [frozenset({str(cert), str(key)})]
        nursery.cancel_scope.cancel()


async def test_an_edit_in_place_is_seen_and_an_unwatched_file_is_not(tmp_path: Path, autojump_clock: object) -> None:
    config, other = tmp_path / "config.yaml", tmp_path / "other.yaml"
    config.write_text("a: 1\n")
    other.write_text("b: 1\n")
    calls = Calls()
    async with trio.open_nursery() as nursery:
        await watch(FileWatcher([str(config)], calls), nursery)
        other.write_text("b: 2\n")
        await trio.sleep(10)
        assert calls.changes == []
        with config.open("a") as f:  # same inode, new size and mtime
            f.write("c: 3\n")
        await trio.sleep(10)
        assert calls.changes == [frozenset({str(config)})]
        nursery.cancel_scope.cancel()


async def test_a_missing_file_is_reported_and_so_is_its_return(tmp_path: Path, autojump_clock: object) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("a: 1\n")
    calls = Calls()
    async with trio.open_nursery() as nursery:
        await watch(FileWatcher([str(config)], calls), nursery)
        config.unlink()
        await trio.sleep(10)
        config.write_text("a: 2\n")
        await trio.sleep(10)
        assert calls.changes == [frozenset({str(config)}), frozenset({str(config)})]
        nursery.cancel_scope.cancel()


async def test_set_paths_watches_the_files_a_reload_names(tmp_path: Path, autojump_clock: object) -> None:
    old_cert, new_cert = tmp_path / "old.pem", tmp_path / "new.pem"
    old_cert.write_text("old")
    new_cert.write_text("new")
    calls = Calls()
    watcher = FileWatcher([str(old_cert)], calls)
    async with trio.open_nursery() as nursery:
        await watch(watcher, nursery)
        watcher.set_paths([str(new_cert)])
        assert watcher.paths == {str(new_cert)}
        old_cert.write_text("old, changed")
        await trio.sleep(10)
        assert calls.changes == []
        new_cert.write_text("new, changed")
        await trio.sleep(10)
        assert calls.changes == [frozenset({str(new_cert)})]
        nursery.cancel_scope.cancel()


async def test_a_change_already_read_is_not_reported_again(tmp_path: Path, autojump_clock: object) -> None:
    # A SIGHUP reload reads the edited file and marks it read: the watcher, which saw the
    # edit too (before its poll, or while letting it settle), must not reload it once more.
    config = tmp_path / "config.yaml"
    config.write_text("a: 1\n")
    calls = Calls()
    watcher = FileWatcher([str(config)], calls)
    async with trio.open_nursery() as nursery:
        await watch(watcher, nursery)
        await trio.sleep(0.5)
        config.write_text("a: 22\n")
        watcher.mark_read()  # before the next poll
        await trio.sleep(10)
        config.write_text("a: 333\n")
        await trio.sleep(1.2)  # polled at 11 s and seen: settling until 12 s
        watcher.mark_read()
        await trio.sleep(10)
        assert calls.changes == []
        config.write_text("a: 4444\n")  # a later edit is reported
        await trio.sleep(10)
        assert calls.changes == [frozenset({str(config)})]
        nursery.cancel_scope.cancel()
