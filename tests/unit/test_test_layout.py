"""The test tree has no __init__.py files, so pytest imports each test file by its basename: two
files of one name in different folders stop the collection of the whole suite."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_no_two_test_files_share_a_basename() -> None:
    places: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        places[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in places.items() if len(paths) > 1}
    assert shared == {}
