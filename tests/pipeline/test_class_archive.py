"""The archive of Spark's classes (JDK class data sharing) that makes a report's
JVM start sooner: a session with none writes it as its JVM exits (here the one
tools/spark-class-archive runs), the next maps it, and one the JVM refuses
(here: garbage) is deleted and made again; writing one deletes those of other
installs unused for 30 days. Each session is a real Spark JVM in a process of
its own, with its own cache directory (``XDG_CACHE_HOME``); whether the JVM
mapped the archive is read from its ``/proc/PID/maps``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

SESSION = """
from pipeline.session import class_archive_path, spark_session, stop_session
spark = spark_session("local[1]", progress=False, driver_memory="1g", short_job=True, class_archive=True)
pid = spark.sparkContext._gateway.proc.pid
mapped = str(class_archive_path()) in open(f"/proc/{pid}/maps").read()
assert spark.range(5).count() == 5
stop_session(spark, say=print)
print("mapped" if mapped else "not mapped")
"""


def session(**env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", SESSION], capture_output=True, text=True, cwd=ROOT, timeout=300, env=environment
    )


@pytest.mark.usefixtures("java")
def test_a_refused_archive_is_replaced_by_the_set_up_tools_which_the_next_session_maps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive's whole life in one cache directory (each archive written costs 10-30 s): one the JVM
    refuses is deleted; tools/spark-class-archive (which `make demo` runs first) writes a new one with a
    small report, deleting another install's unused one, and run again does nothing; the next session
    maps it; and a session with a configuration directory on its classpath leaves it alone."""
    from pipeline.session import UNUSED_ARCHIVE_DAYS, class_archive_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # this test's sessions and tools inherit it
    archive = class_archive_path()
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"not an archive" * 100)

    refused = session()
    assert refused.returncode == 0, refused.stderr[-2000:]
    assert refused.stdout.splitlines()[-1] == "not mapped"
    assert "warning" not in refused.stdout + refused.stderr  # the JVM's CDS warnings are silenced
    assert not archive.exists(), "a refused archive is deleted"
    assert "saving Spark's classes" not in refused.stdout, "a session told to map an archive writes none"

    # Archives of other installs: one no session has mapped for longer than UNUSED_ARCHIVE_DAYS, one recent.
    unused = archive.with_name("spark-0.0.0-classes-000000000000.jsa")
    recent = archive.with_name("spark-0.0.0-classes-111111111111.jsa")
    for other in (unused, recent):
        other.write_bytes(b"archive of another install")
    long_ago = time.time() - (UNUSED_ARCHIVE_DAYS + 1) * 86400
    os.utime(unused, (long_ago, long_ago))

    tool = [str(ROOT / "tools" / "spark-class-archive")]
    env = {**os.environ, "PYTHON": sys.executable}
    first = subprocess.run(tool, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout == f"Spark's class archive: {archive}\n"
    assert archive.is_file() and archive.stat().st_size > 1_000_000
    assert sorted(p.name for p in archive.parent.iterdir()) == sorted([archive.name, recent.name]), (
        "no partial archive left; the unused one of another install deleted, the recent one kept"
    )
    recent.unlink()
    stamp = archive.stat().st_mtime_ns

    again = subprocess.run(tool, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout == "" and again.stderr == ""
    # A session that maps the archive touches it (pipeline.session: when it was last used)
    assert archive.stat().st_mtime_ns == stamp, "no report ran, and the archive is left as it was"

    mapping = session()
    assert mapping.returncode == 0, mapping.stderr[-2000:]
    assert mapping.stdout.splitlines()[-1] == "mapped"
    assert "saving Spark's classes" not in mapping.stdout
    assert archive.is_file()

    # A configuration directory (SPARK_CONF_DIR) is on the driver's classpath, and the JDK neither maps nor
    # writes an archive with a directory there: such sessions use none and leave this one alone (they
    # refused and deleted it, then failed to write theirs).
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    written = archive.stat().st_mtime_ns
    with_conf = session(SPARK_CONF_DIR=str(conf))
    assert with_conf.returncode == 0, with_conf.stderr[-2000:]
    assert with_conf.stdout.splitlines()[-1] == "not mapped"
    assert "saving Spark's classes" not in with_conf.stdout
    assert archive.is_file() and archive.stat().st_mtime_ns == written, "the archive is kept as it was"
    assert sorted(p.name for p in archive.parent.iterdir()) == [archive.name]


def test_jars_put_at_the_same_path_again_get_an_archive_of_their_own(tmp_path: Path) -> None:
    """A fresh clone's new .venv at the path of an older one: its jars are new files, which the JVM
    would refuse the older archive for, so their archive has another key (and another file)."""
    from pipeline.session import archive_key

    install = tmp_path / "pyspark"
    (install / "jars").mkdir(parents=True)
    java = os.path.realpath(shutil.which("java") or "/usr/bin/java")
    first = archive_key(str(install), "4.3.0", java)
    assert archive_key(str(install), "4.3.0", java) == first
    os.utime(install / "jars", ns=(1_000_000_000, 1_000_000_000))  # the jars put there again
    again = archive_key(str(install), "4.3.0", java)
    assert again != first
    assert again.split("-")[0] == first.split("-")[0]  # the same place: its archive replaces the older one


def test_another_java_runtime_gets_an_archive_of_its_own_that_keeps_the_first(tmp_path: Path) -> None:
    """JAVA_HOME switched to another runtime and back: each has its archive, and writing one does not
    delete the other's (each switch rewrote the archive, 10-30 s)."""
    from pipeline.session import _ARCHIVE_NAME, _drop_unused_archives, archive_key

    install = tmp_path / "pyspark"
    (install / "jars").mkdir(parents=True)
    java = os.path.realpath(shutil.which("java") or "/usr/bin/java")
    other_java = tmp_path / "jdk-25" / "bin" / "java"
    other_java.parent.mkdir(parents=True)
    other_java.write_bytes(b"another runtime")
    first = archive_key(str(install), "4.3.0", java)
    other = archive_key(str(install), "4.3.0", str(other_java))
    assert other.split("-")[0] != first.split("-")[0]  # another place: neither replaces the other
    archives = tmp_path / "cache"
    archives.mkdir()
    for key in (first, other):
        (archives / _ARCHIVE_NAME.format(version="4.3.0", key=key)).write_bytes(b"archive")
    _drop_unused_archives(archives / _ARCHIVE_NAME.format(version="4.3.0", key=other))
    assert len(list(archives.iterdir())) == 2


def test_a_new_archive_replaces_the_one_of_the_venv_that_was_at_its_path(tmp_path: Path) -> None:
    from pipeline.session import _drop_unused_archives

    kept = tmp_path / "spark-4.3.0-classes-aaaaaaaa-11111111.jsa"
    replaced = tmp_path / "spark-4.3.0-classes-aaaaaaaa-22222222.jsa"  # the older .venv at the same path
    elsewhere = tmp_path / "spark-4.3.0-classes-bbbbbbbb-33333333.jsa"  # another .venv's, in use
    for archive in (kept, replaced, elsewhere):
        archive.write_bytes(b"archive")
    _drop_unused_archives(kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([kept.name, elsewhere.name])
