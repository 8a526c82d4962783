"""Failures an operator can act on, raised deep inside the proxy and reported by
the command line as one line each, without a traceback: what could not be done,
where (listener, port, file) and why."""

from __future__ import annotations


class BindError(OSError):
    """A port the proxy must listen on cannot be bound (in use, not permitted, no such address)."""

    def __init__(self, what: str, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.what = what  # "listener external", "admin"
        self.host = host
        self.port = port

    def __str__(self) -> str:
        return f"{self.what}: cannot listen on {self.host}:{self.port}: {self.strerror}"


class TlsMaterialError(ValueError):
    """A certificate, key or key password that TLS cannot use; the message names the file."""
