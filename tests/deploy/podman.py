"""Podman as these machines need it (../shared/TOOLS.md, "Containers, for real"): runc with
cgroupfs (crun refuses the hybrid cgroup layout), ulimits it may set, the host network and the
host's CA bundle for pip, and a base image made locally with mmdebstrap (no registry is
reachable), cached under .cache/image keyed by the command that made it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

CACHE = ROOT / ".cache" / "image"
# The base: Debian bookworm (Python 3.11) with what the Dockerfile's build stage runs. The
# merged-usr hook lays out /usr merged itself: without it bookworm's usrmerge package stays
# installed, and with it Perl (a 248 MB base, not 199 MB).
BASE_COMMAND = (
    "mmdebstrap",
    "--variant=minbase",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates",
    "bookworm",
)
# The example broker's base (test_kube_play.py): Debian's Java 17 runtime, for Apache Kafka's jars.
JRE_COMMAND = (
    "mmdebstrap",
    "--variant=minbase",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--include=openjdk-17-jre-headless",
    "bookworm",
)
# An imported tarball has no environment; this is the PATH Debian's images set.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# `podman run` fails with "setrlimit: Operation not permitted" under its default ulimits here.
ULIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
# The same limits for `podman kube play`, which has no --ulimit: a CONTAINERS_CONF file's.
CONTAINERS_CONF = '[containers]\ndefault_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n'
IMAGE_SOURCE = "https://example.com/kafka-admission-proxy"  # the source label of test builds


def podman_command() -> list[str]:
    """``podman`` with this machine's runtime flags; a skip (a failure under REQUIRE_ALL=1) naming
    what is missing."""
    missing = [
        name
        for name in ("podman", "runc", "mmdebstrap")
        if shutil.which(name) is None and not Path("/usr/sbin", name).exists()
    ]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (tools/apt-install podman runc mmdebstrap)")
    if os.geteuid() != 0:
        pytest.skip("podman runs images here as root only (rootless needs subuids and crun)")
    runc = shutil.which("runc") or "/usr/sbin/runc"
    return ["podman", "--runtime", runc, "--cgroup-manager=cgroupfs"]


def podman(
    *args: str, timeout: float = 120, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One podman command; with ``check``, a failure is an assertion carrying podman's own words."""
    result = subprocess.run(
        [*podman_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
    if check:
        assert result.returncode == 0, f"podman {' '.join(args[:2])} exited {result.returncode}:\n{result.stderr}"
    return result


def base_image() -> str:
    """The proxy image's base, tagged by a hash of :data:`BASE_COMMAND`: made once (about a
    minute, a 199 MB tarball), imported from the cached tarball when the image store lacks it,
    else reused. Delete .cache/image to take Debian's newest packages."""
    return debian_image("kafka-admission-proxy-base", BASE_COMMAND)


def debian_image(name: str, command: tuple[str, ...]) -> str:
    """An image made by the mmdebstrap ``command`` (its tarball cached under .cache/image), tagged
    ``localhost/NAME:<hash of the command>``."""
    key = hashlib.sha256(repr((command, BASE_PATH)).encode()).hexdigest()[:16]
    tag = f"localhost/{name}:{key}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    tarball = CACHE / f"{name.rsplit('-', 1)[-1]}-{key}.tar"  # base-<key>.tar for the proxy's base
    if not tarball.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = CACHE / f"{tarball.stem}.partial-{os.getpid()}.tar"  # mmdebstrap reads the format from .tar
        try:
            made = subprocess.run([*command, str(partial)], capture_output=True, text=True, timeout=900)
            assert made.returncode == 0, f"mmdebstrap exited {made.returncode}:\n{made.stderr[-4000:]}"
            partial.replace(tarball)  # whole or not at all, for a concurrent or interrupted run
        finally:
            partial.unlink(missing_ok=True)
    podman("import", "--change", f"ENV PATH={BASE_PATH}", str(tarball), tag, timeout=300)
    return tag


def network_build_options() -> list[str]:
    """pip in a build step reaches the index only over the host network, trusting the host's CAs."""
    options = ["--network", "host"]
    if CA_BUNDLE.exists():
        options += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    return options


def revision() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def build_image(tag: str, source: str) -> str:
    """deploy/Dockerfile built on the local base, in the docker format (OCI drops HEALTHCHECK).
    Without the layer cache: podman 4.3's builder (buildah 1.28) reuses a cached LABEL step when
    only a build argument changed, and would keep an older commit's revision label."""
    podman(
        "build",
        "--no-cache",
        "--layers=false",
        "--format",
        "docker",
        *network_build_options(),
        "--build-arg",
        f"PYTHON_IMAGE={base_image()}",
        "--build-arg",
        f"REVISION={revision()}",
        "--build-arg",
        f"SOURCE={source}",
        "-f",
        str(ROOT / "deploy" / "Dockerfile"),
        "-t",
        tag,
        str(ROOT),
        timeout=900,
    )
    return tag
