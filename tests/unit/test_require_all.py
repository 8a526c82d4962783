"""The REQUIRE_ALL=1 switch turns every kind of skip into a failure, at run time and at
collection, and pyproject's ``xfail_strict`` fails a known defect that no longer fails.
Each case runs a child pytest over files of its own (in its own tmp_path, so that no two
tests share a file under xdist) with this suite's options and its conftest as a plugin."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Each kind of skip, in a folder of its own: (files, the reason its skip gives).
SKIPS = {
    "in_the_test": (
        {"test_x.py": "import pytest\n\ndef test_needs_tool():\n    pytest.skip('tool 1 missing')\n"},
        "tool 1 missing",
    ),
    "skipif_mark": (
        {
            "test_x.py": "import pytest\n\n@pytest.mark.skipif(True, reason='tool 2 missing')\n"
            "def test_needs_tool():\n    pass\n"
        },
        "tool 2 missing",
    ),
    "module_level": (
        {
            "test_x.py": "import pytest\n\npytest.skip('tool 3 missing', allow_module_level=True)\n\n"
            "def test_needs_tool():\n    pass\n"
        },
        "tool 3 missing",
    ),
    "importorskip": (
        {"test_x.py": "import pytest\n\npytest.importorskip('tool_4_missing')\n\ndef test_needs_tool():\n    pass\n"},
        "could not import 'tool_4_missing'",
    ),
    "in_a_conftest": (
        {
            "conftest.py": "import pytest\n\npytest.skip('tool 5 missing', allow_module_level=True)\n",
            "test_x.py": "def test_needs_tool():\n    pass\n",
        },
        "tool 5 missing",
    ),
}
# Beside them, a test that needs nothing: it runs either way.
PLAIN = {"test_plain.py": "def test_needs_nothing():\n    pass\n"}


def _run(folder: Path, files: dict[str, str], require_all: str) -> subprocess.CompletedProcess[str]:
    """A child pytest over ``files`` with this suite's options and its conftest (as a plugin)."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    env = {**os.environ, "REQUIRE_ALL": require_all}
    options = "-q -p no:cacheprovider -p no:xdist -p tests.conftest --continue-on-collection-errors".split()
    command = [sys.executable, "-m", "pytest", *options, "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(folder)]
    return subprocess.run([*command, str(folder)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def _every_skip() -> dict[str, str]:
    """Every kind in its own folder; test modules named after their kind (no two of one name)."""
    every = dict(PLAIN)
    for kind, (files, _) in SKIPS.items():
        for name, text in files.items():
            every[f"{kind}/{name.replace('test_x', f'test_{kind}')}"] = text
    return every


def test_every_kind_of_skip_fails_under_require_all(tmp_path: Path) -> None:
    result = _run(tmp_path, _every_skip(), "1")
    assert result.returncode == 1, result.stdout
    for kind, (_, reason) in SKIPS.items():
        assert f"skipped under REQUIRE_ALL=1 (install what it needs): Skipped: {reason}" in result.stdout, kind
    # A skip in a test fails it; a skipif (at its setup) and a skip while collecting are errors.
    assert result.stdout.splitlines()[-1].startswith("1 failed, 1 passed, 4 errors in "), result.stdout


def test_every_kind_of_skip_is_a_skip_without_require_all(tmp_path: Path) -> None:
    result = _run(tmp_path, _every_skip(), "0")
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[-1].startswith(f"1 passed, {len(SKIPS)} skipped"), result.stdout


def test_a_known_defect_that_still_fails_is_an_expected_failure_under_require_all(tmp_path: Path) -> None:
    test = "import pytest\n\n@pytest.mark.xfail(reason='known defect')\ndef test_defect():\n    assert False\n"
    result = _run(tmp_path, {"test_x.py": test}, "1")
    assert result.returncode == 0, result.stdout
    assert "1 xfailed" in result.stdout, result.stdout


def test_a_known_defect_that_passes_fails_the_run(tmp_path: Path) -> None:
    """pyproject's ``xfail_strict = true``: a fixed defect's xfail mark must go."""
    test = "import pytest\n\n@pytest.mark.xfail(reason='known defect')\ndef test_defect():\n    pass\n"
    result = _run(tmp_path, {"test_x.py": test}, "0")
    assert result.returncode == 1, result.stdout
    assert "XPASS(strict)" in result.stdout, result.stdout
