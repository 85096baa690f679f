"""The TLS settings a client takes from flags or from GEARSHIFT_TLS_* (the operator): one
check, whose errors name what the user set (the flag or the variable) and the path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gearshift.client.options import environment_tls
from gearshift.common.auth import CA_VARIABLE, CERT_VARIABLE, KEY_VARIABLE, ClientTls
from gearshift.common.errors import ValidationError


def test_environment_tls_reads_the_variables_and_names_a_bad_one(tmp_path: Path) -> None:
    files = {name: tmp_path / name for name in ("ca.crt", "tls.crt", "tls.key")}
    for path in files.values():
        path.write_text("PEM")
    ca, cert, key = (str(p) for p in files.values())
    assert environment_tls({}) is None, "no CA: plaintext"
    assert environment_tls({CA_VARIABLE: ca}) == ClientTls(files["ca.crt"])
    full = {CA_VARIABLE: ca, CERT_VARIABLE: cert, KEY_VARIABLE: key}
    assert environment_tls(full) == ClientTls(files["ca.crt"], files["tls.crt"], files["tls.key"])
    refused = {
        f"{KEY_VARIABLE}: {tmp_path / 'gone'} is not a file": {
            **full,
            KEY_VARIABLE: str(tmp_path / "gone"),
        },
        f"{CERT_VARIABLE}: and {KEY_VARIABLE} must be given together": {
            CA_VARIABLE: ca,
            CERT_VARIABLE: cert,
        },
        f"{CA_VARIABLE}: is required with": {CERT_VARIABLE: cert, KEY_VARIABLE: key},
    }
    for message, env in refused.items():
        with pytest.raises(ValidationError, match=re.escape(message)):
            environment_tls(env)
