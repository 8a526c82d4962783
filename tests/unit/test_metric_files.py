"""A dead process's metric files (proxy/workers/metrics.py, ``MetricsFiles.process_gone``):
written as prometheus-client's multiprocess mode writes them (MmapedDict, one file per type,
gauge mode and pid), folded into the kept ``*_dead.db`` files the way each type combines."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict, mmap_key

from proxy.workers.metrics import MetricsFiles


def write(directory: Path, prefix: str, pid: int, name: str, value: float, timestamp: float = 0.0) -> None:
    values = MmapedDict(str(directory / f"{prefix}_{pid}.db"))
    values.write_value(mmap_key(name, name, [], [], "help"), value, timestamp)
    values.close()


def test_a_dead_processs_files_fold_into_one_kept_file_per_type_as_each_combines(tmp_path: Path) -> None:
    files = MetricsFiles.open(str(tmp_path))
    for pid, (count, biggest, oldest, recent, live) in {11: (3, 5, 100, 7, 2), 22: (4, 9, 50, 8, 1)}.items():
        write(tmp_path, "counter", pid, "c_total", count)
        write(tmp_path, "gauge_max", pid, "g_max", biggest)
        write(tmp_path, "gauge_min", pid, "g_min", oldest)
        write(tmp_path, "gauge_mostrecent", pid, "g_recent", recent, timestamp=1000.0 + (pid == 11))
        write(tmp_path, "gauge_livesum", pid, "g_live", live)
    write(tmp_path, "counter", 33, "c_total", 10)  # a live process

    files.process_gone(11)
    files.process_gone(22)

    assert sorted(os.listdir(tmp_path)) == [
        "counter_33.db",
        "counter_dead.db",
        "gauge_max_dead.db",
        "gauge_min_dead.db",
        "gauge_mostrecent_dead.db",
    ]
    seen = {s.name: s.value for family in files.collect() for s in family.samples}
    assert seen == {"c_total": 17, "g_max": 9, "g_min": 50, "g_recent": 7}  # the dead's live gauge is gone
    files.close()
