"""This distribution's version, in a module of its own: the command line reads it for ``--version``
without loading the metrics (prometheus-client, trio)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["package_version"]


def package_version() -> str:
    """This distribution's version, as ``--version`` and ``kafka_admission_build_info`` show it."""
    try:
        return version("kafka-admission-proxy")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
