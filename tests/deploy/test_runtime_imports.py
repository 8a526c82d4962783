"""The runtime install (requirements/runtime.txt and this package without extras, the image's
install, ``runtime_venv``) imports every module of ``proxy`` and ``policies``, and none of them
brings in a test, bench or demo module, or a development or pipeline dependency (issue 28: the
runtime package holds no demo, test or bench helper)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import ROOT

RUNTIME_PACKAGES = ("proxy", "policies")
# Top-level packages the runtime must never import: this repository's development code, and
# what only the extras or the development install bring.
FORBIDDEN = ("tests", "bench", "demo", "pyspark", "pytest", "hypothesis")

# Run by the install's own Python, isolated (-I: neither PYTHONPATH nor the working directory
# is on sys.path), so only the installed package can be imported.
_IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, sys
names = []
for top in {packages!r}:
    package = importlib.import_module(top)
    names.append(top)
    names += [m.name for m in pkgutil.walk_packages(package.__path__, top + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({{"walked": names, "loaded": {{n: getattr(m, "__file__", None) for n, m in sys.modules.items()}}}}))
"""


def _checkout_modules() -> set[str]:
    """The module names of ``RUNTIME_PACKAGES`` in this checkout, from its files."""
    names = set()
    for top in RUNTIME_PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_runtime_module_imports_without_test_bench_or_demo_modules(runtime_venv: Path, tmp_path: Path) -> None:
    script = _IMPORT_EVERY_MODULE.format(packages=RUNTIME_PACKAGES)
    clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [str(runtime_venv / "bin" / "python"), "-I", "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert set(found["walked"]) == _checkout_modules()
    loaded: dict[str, str | None] = found["loaded"]
    # The installed copy was imported, not this checkout.
    for name in found["walked"]:
        assert str(loaded[name]).startswith(str(runtime_venv)), f"{name} from {loaded[name]}"
    forbidden = sorted(name for name in loaded if name.partition(".")[0] in FORBIDDEN)
    assert forbidden == [], f"the runtime modules import {forbidden}"
