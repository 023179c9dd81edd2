"""The CA certificate bundle this worker trusts, as setup in images must trust it too.

A worker that reaches the package registries through a TLS-inspecting proxy (or a registry mirror behind an
operator's CA) trusts that proxy's CA through its bundle: Debian's :data:`SYSTEM_BUNDLE`, or a file the operator
names with ``DURAFIX_CA_BUNDLE``. :class:`CABundle` reads it (and refuses a path that is not one, naming the path
and the setting); :data:`CA_VARIABLES` are the variables tools read a bundle's path from, with the values they
take where the bundle is installed the Debian way (in an image: :mod:`environments.docker.trust`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from environments.interface import EnvironmentError

# Debian's system bundle: the default of DURAFIX_CA_BUNDLE, and where update-ca-certificates writes the bundle.
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SYSTEM_CERT_DIR = "/etc/ssl/certs"
# Each variable some tool reads a CA bundle (or directory) from, pointed at the system bundle: OpenSSL and
# Python's ssl, pip, requests, curl, git, and Node (npm), which otherwise trusts only its compiled-in roots.
CA_VARIABLES = {
    "SSL_CERT_FILE": SYSTEM_BUNDLE,
    "SSL_CERT_DIR": SYSTEM_CERT_DIR,
    "PIP_CERT": SYSTEM_BUNDLE,
    "REQUESTS_CA_BUNDLE": SYSTEM_BUNDLE,
    "CURL_CA_BUNDLE": SYSTEM_BUNDLE,
    "GIT_SSL_CAINFO": SYSTEM_BUNDLE,
    "NODE_EXTRA_CA_CERTS": SYSTEM_BUNDLE,
}
_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_FIX = "set DURAFIX_CA_BUNDLE to the PEM file of the CA certificates this worker trusts, or to none"


class CABundleError(EnvironmentError):
    """The configured CA bundle is not a readable file of PEM certificates; the message names the path and the
    setting (``DURAFIX_CA_BUNDLE``). Permanent until the operator fixes the setting."""


@dataclass(frozen=True)
class CABundle:
    """The worker's CA bundle as read now: where it is, its bytes and their SHA-256 (hex)."""

    path: Path
    content: bytes
    digest: str

    @classmethod
    def read(cls, path: Path) -> CABundle:
        """The bundle at ``path``; :class:`CABundleError` naming it when it is missing, unreadable or holds no PEM
        certificate."""
        try:
            content = path.read_bytes()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise CABundleError(f"the CA bundle {path} (DURAFIX_CA_BUNDLE) cannot be read: {reason}; {_FIX}") from exc
        if _PEM_CERTIFICATE not in content:
            raise CABundleError(f"the CA bundle {path} (DURAFIX_CA_BUNDLE) holds no PEM certificate; {_FIX}")
        return cls(path=path, content=content, digest=hashlib.sha256(content).hexdigest())

    def short(self) -> str:
        """``sha256:<12 hex digits>``, as logs name the bundle."""
        return f"sha256:{self.digest[:12]}"
