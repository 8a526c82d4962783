"""The hash-locked requirement files stay in step with pyproject.toml: every
dependency is pinned (with hashes) at a version its specifier allows, and the
runtime lock, which the image installs, holds none of the extras. After a
change of dependencies: `make lock`."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "requirements"


def pins(lock: Path) -> dict[str, str]:
    text = lock.read_text()
    found = {}
    pinned_with_hashes = r"^([A-Za-z0-9_.\-]+)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}[ \\]*\n)+)"
    for match in re.finditer(pinned_with_hashes, text, re.M):
        found[canonicalize_name(match[1])] = match[2]
    unhashed = [
        line
        for line in text.splitlines()
        if "==" in line and not line.startswith(" ") and canonicalize_name(line.split("==")[0]) not in found
    ]
    assert unhashed == [], f"{lock.name}: pinned without hashes: {unhashed}"
    return found


def project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def extras() -> dict[str, list[str]]:
    return project()["optional-dependencies"]  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("lock", "groups"),
    [
        ("runtime.txt", ["runtime"]),
        ("dev.txt", ["runtime", "test", "demo", "pipeline"]),
    ],
)
def test_every_dependency_is_pinned_with_hashes_at_an_allowed_version(lock: str, groups: list[str]) -> None:
    pinned = pins(LOCKS / lock)
    for group in groups:
        requirements = project()["dependencies"] if group == "runtime" else extras()[group]
        for line in requirements:  # type: ignore[attr-defined]
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            assert name in pinned, f"{lock}: {requirement.name} ({group}) is not pinned; run make lock"
            assert requirement.specifier.contains(pinned[name], prereleases=True), (
                f"{lock}: {requirement.name}=={pinned[name]} does not satisfy {requirement.specifier}; run make lock"
            )


def test_the_runtime_lock_holds_none_of_the_extras() -> None:
    runtime = pins(LOCKS / "runtime.txt")
    for group in ("demo", "pipeline"):
        for line in extras()[group]:
            assert canonicalize_name(Requirement(line).name) not in runtime, f"{line} ({group}) in runtime.txt"


def test_the_deploy_tools_are_pinned_with_hashes() -> None:
    wanted = [
        line.strip()
        for line in (LOCKS / "deploy-tools.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    pinned = pins(LOCKS / "deploy-tools.txt")
    assert {canonicalize_name(Requirement(w).name) for w in wanted} <= set(pinned)


def test_the_build_backend_is_pinned_with_hashes_at_an_allowed_version() -> None:
    """The image builds this package with requirements/build.txt's backend (no isolated build, which
    would fetch whatever the index serves): it pins every build-system.requires, and only those."""
    pinned = pins(LOCKS / "build.txt")
    build_system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    requires = [Requirement(line) for line in build_system["requires"]]
    assert set(pinned) == {canonicalize_name(r.name) for r in requires}, "run make lock"
    for requirement in requires:
        assert requirement.specifier.contains(pinned[canonicalize_name(requirement.name)]), "run make lock"
