"""The REQUIRE_ALL=1 switch turns skips into failures (checked in a child pytest
that loads this suite's conftest)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def skipping_test() -> "Path":
    folder = ROOT / "tests" / "unit" / "_generated_skip"
    folder.mkdir(exist_ok=True)
    test = folder / "test_skipper.py"
    test.write_text("import pytest\n\ndef test_needs_tool():\n    pytest.skip('tool missing')\n")
    yield test
    shutil.rmtree(folder)


def _run(test: Path, require_all: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REQUIRE_ALL": require_all}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )


def test_a_skip_fails_under_require_all(skipping_test: Path) -> None:
    result = _run(skipping_test, "1")
    assert result.returncode == 1, result.stdout
    assert "skipped under REQUIRE_ALL=1" in result.stdout


def test_a_skip_is_a_skip_without_require_all(skipping_test: Path) -> None:
    result = _run(skipping_test, "0")
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
