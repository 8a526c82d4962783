"""A private key or key password file that others can read is named in one warning line
(the config key, the file, its mode and the rule): at start, in check-config and at each
reload, while the proxy goes on serving TLS with it. Real files, the real proxy's log."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import trustme
from cryptography.hazmat.primitives import serialization

from demo.tansu import TansuBroker
from tests.conftest import ROOT, wait_until
from tests.integration.test_tls_sessions import connect_twice

PASSWORD = b"not-in-the-config"


def tls_files(folder: Path, key_mode: int, password_mode: int) -> tuple[dict[str, str], str]:
    """A listener's TLS section with an encrypted key and its password file, in these modes; and its CA."""
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(folder / "server.pem"))
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), None)
    (folder / "server.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(PASSWORD),
        )
    )
    (folder / "key.password").write_bytes(PASSWORD + b"\n")
    os.chmod(folder / "server.key", key_mode)
    os.chmod(folder / "key.password", password_mode)
    tls = {
        "cert_file": str(folder / "server.pem"),
        "key_file": str(folder / "server.key"),
        "key_password_file": str(folder / "key.password"),
    }
    return tls, str(folder / "ca.pem")


def warnings_about(text: str, folder: Path) -> list[str]:
    """The warnings about files in ``folder``, without the text log's time, level and logger."""
    return [
        line.split(" ", 4)[4]
        for line in text.splitlines()
        if " WARNING kafka_admission_proxy.tls " in line and str(folder) in line
    ]


def expected(folder: Path) -> list[str]:
    """The two lines, in order: the key readable by every user, the password file by its group."""
    rule = "should be readable by the proxy's user only (chmod 0600, or 0440 for a group only the proxy is in)"
    gid = os.stat(folder / "key.password").st_gid
    return [
        f"listeners[0].tls.key_file: {folder / 'server.key'} is readable by every user (mode 0644): "
        f"a private key or its password {rule}",
        f"listeners[0].tls.key_password_file: {folder / 'key.password'} is readable by group {gid} (mode 0640): "
        f"a private key or its password {rule}",
    ]


def test_a_key_and_a_password_file_others_can_read_are_warned_about_at_start_and_in_check_config(
    tansu: TansuBroker, start_proxy: Any, tmp_path: Path
) -> None:
    tls, ca_file = tls_files(tmp_path, 0o644, 0o640)
    proxy = start_proxy(tansu.bootstrap, listeners=[{"name": "tls", "tls": tls}])
    # A warning, not an error: the proxy serves TLS with that key.
    assert connect_twice(proxy.bootstrap, ca_file, ssl.TLSVersion.TLSv1_3)
    assert warnings_about(proxy.log(), tmp_path) == expected(tmp_path), proxy.log()
    checked = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(proxy.config_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    assert warnings_about(checked.stderr, tmp_path) == expected(tmp_path), checked.stderr
    assert PASSWORD.decode() not in proxy.log() + checked.stderr


def test_a_key_file_opened_up_is_warned_about_at_the_next_reload(
    tansu: TansuBroker, start_proxy: Any, tmp_path: Path
) -> None:
    tls, _ = tls_files(tmp_path, 0o600, 0o600)
    proxy = start_proxy(tansu.bootstrap, listeners=[{"name": "tls", "tls": tls}])
    assert warnings_about(proxy.log(), tmp_path) == []  # owner-only: nothing to say
    os.chmod(tmp_path / "server.key", 0o644)
    os.chmod(tmp_path / "key.password", 0o640)
    proxy.reload()  # SIGHUP, and the reload counted as a success
    assert wait_until(lambda: warnings_about(proxy.log(), tmp_path)) == expected(tmp_path)
