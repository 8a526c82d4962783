"""An encrypted TLS key's password: from a file or an environment variable, never
from the config file itself. Read only where a key is opened (the TLS contexts,
the certificate inspection); never logged, audited or printed."""

from __future__ import annotations

import os
from pathlib import Path


class KeyPasswordError(ValueError):
    """The password cannot be read; the message names the file or variable, never a password."""


def read_key_password(key_password_file: str | None, key_password_env: str | None) -> tuple[bytes | None, str]:
    """(the password or None, where it came from: for messages only)."""
    if key_password_file is not None:
        try:
            return Path(key_password_file).read_bytes().rstrip(b"\r\n"), key_password_file
        except OSError as exc:
            raise KeyPasswordError(f"cannot read key_password_file {key_password_file}: {exc.strerror}") from None
    if key_password_env is not None:
        value = os.environ.get(key_password_env)
        if value is None:
            raise KeyPasswordError(f"key_password_env {key_password_env} is not set in the environment")
        return value.encode(), f"${key_password_env}"
    return None, ""
