"""The worker's CA bundle: what is read, what is refused and named, and how it keys the CA layer."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from environments.ca_bundle import CABundle, CABundleError
from environments.docker.trust import trust_tag

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_a_bundle_is_read_with_its_digest_and_keys_the_layer_with_the_base(tmp_path: Path) -> None:
    path = tmp_path / "bundle.pem"
    path.write_bytes(PEM)
    bundle = CABundle.read(path)
    assert bundle.digest == hashlib.sha256(PEM).hexdigest()
    assert bundle.short() == f"sha256:{bundle.digest[:12]}"
    assert trust_tag("sha256:base", bundle) == trust_tag("sha256:base", CABundle.read(path))
    path.write_bytes(PEM + PEM)
    changed = CABundle.read(path)
    assert trust_tag("sha256:base", bundle) != trust_tag("sha256:base", changed)
    assert trust_tag("sha256:base", bundle) != trust_tag("sha256:other", bundle)


def test_a_file_without_a_certificate_is_refused_naming_it_and_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "not-pem.txt"
    path.write_text("not a certificate\n")
    with pytest.raises(CABundleError, match=f"the CA bundle {path} \\(DURAFIX_CA_BUNDLE\\) holds no PEM certificate"):
        CABundle.read(path)
