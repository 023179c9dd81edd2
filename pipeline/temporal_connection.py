"""How every durafix process connects to Temporal: address, namespace, TLS (server CA, mTLS client certificate,
server name) and API key, read from :class:`~pipeline.config.DurafixConfig`.

The worker, the CLI and the webhook receiver all connect through :func:`connect`, which takes its
arguments from :func:`connect_options`, so a cluster secured one way is reached the same way
by all of them.

Contracts:

- **TLS is on** when ``temporal_tls`` says so, or, when it is unset, as soon as anything that only makes sense
  over TLS is configured (a CA, a client certificate or key, a server name, an API key). Without any of them
  the connection is plaintext, as the local dev server needs.
- **Half configurations are refused** before anything connects, with a :class:`TemporalSettingsError` naming
  the setting: a client certificate without its key (or a key without its certificate), a certificate and
  key that do not belong together, a file that is missing, unreadable, not absolute or not PEM, an
  encrypted private key (the SDK cannot use one), an API key given twice (value and file), and TLS
  switched off while TLS material or an API key is configured (an API key is never sent in the clear).
- Files are read at connect time, so a rotated certificate is picked up by the next process start.
- Secrets stay out of messages: errors name settings and paths, never key material or the API key.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from pipeline import tracing
from pipeline.config import DurafixConfig, SettingsError

# The variable that sets each field (and, in STATE/config.json, the field itself): what an error names.
VARIABLES = {
    "temporal_tls": "DURAFIX_TEMPORAL_TLS",
    "temporal_tls_ca": "DURAFIX_TEMPORAL_TLS_CA",
    "temporal_tls_cert": "DURAFIX_TEMPORAL_TLS_CERT",
    "temporal_tls_key": "DURAFIX_TEMPORAL_TLS_KEY",
    "temporal_tls_server_name": "DURAFIX_TEMPORAL_TLS_SERVER_NAME",
    "temporal_api_key": "DURAFIX_TEMPORAL_API_KEY",
    "temporal_api_key_file": "DURAFIX_TEMPORAL_API_KEY_FILE",
}


class TemporalSettingsError(SettingsError):
    """The Temporal connection settings are incomplete or name a file that cannot be used; the message says
    which setting (by its variable and ``config.json`` key) and what to do."""


@dataclass(frozen=True)
class ConnectOptions:
    """The arguments of ``Client.connect`` for one configuration (besides the data converter)."""

    target_host: str
    namespace: str
    tls: TLSConfig | bool
    api_key: str | None

    def describe(self) -> str:
        """``127.0.0.1:7233 (namespace default, plaintext)``, ``... (namespace n, TLS, client certificate, API
        key)``: what a process says it connected to; never a secret."""
        parts = [f"namespace {self.namespace}"]
        if self.tls is False:
            parts.append("plaintext")
        else:
            parts.append("TLS")
            if isinstance(self.tls, TLSConfig):
                if self.tls.server_root_ca_cert is not None:
                    parts.append("own CA")
                if self.tls.client_cert is not None:
                    parts.append("client certificate")
                if self.tls.domain is not None:
                    parts.append(f"server name {self.tls.domain}")
        if self.api_key is not None:
            parts.append("API key")
        return f"{self.target_host} ({', '.join(parts)})"


def connect_options(config: DurafixConfig) -> ConnectOptions:
    """What ``Client.connect`` is given for ``config``; raises :class:`TemporalSettingsError` (see the module's
    contracts) without connecting."""
    api_key = _api_key(config)
    material = {
        name: value
        for name, value in (
            ("temporal_tls_ca", config.temporal_tls_ca),
            ("temporal_tls_cert", config.temporal_tls_cert),
            ("temporal_tls_key", config.temporal_tls_key),
            ("temporal_tls_server_name", config.temporal_tls_server_name),
        )
        if value
    }
    if config.temporal_tls is False:
        needing = [*material, *(["temporal_api_key"] if api_key is not None else [])]
        if needing:
            raise TemporalSettingsError(
                f"{_setting('temporal_tls')} is off but {', '.join(map(_setting, needing))} "
                f"{'is' if len(needing) == 1 else 'are'} set: these only work over TLS (an API key is never sent "
                "in the clear); switch TLS on or unset them"
            )
        return ConnectOptions(config.temporal_address, config.temporal_namespace, False, None)
    tls_on = config.temporal_tls is True or bool(material) or api_key is not None
    if not tls_on:
        return ConnectOptions(config.temporal_address, config.temporal_namespace, False, None)
    tls: TLSConfig | bool = True
    if material:
        cert, key = _client_pair(config)
        tls = TLSConfig(
            server_root_ca_cert=_ca(config.temporal_tls_ca) if config.temporal_tls_ca else None,
            domain=config.temporal_tls_server_name or None,
            client_cert=cert,
            client_private_key=key,
        )
    return ConnectOptions(config.temporal_address, config.temporal_namespace, tls, api_key)


def _setting(field: str) -> str:
    return f"{VARIABLES[field]} ({field})"


def _api_key(config: DurafixConfig) -> str | None:
    if config.temporal_api_key and config.temporal_api_key_file:
        raise TemporalSettingsError(
            f"both {_setting('temporal_api_key')} and {_setting('temporal_api_key_file')} are set: give the API "
            "key one way"
        )
    if config.temporal_api_key:
        return config.temporal_api_key.strip()
    if not config.temporal_api_key_file:
        return None
    key = _read("temporal_api_key_file", config.temporal_api_key_file)[1].decode("utf-8", "replace").strip()
    if not key:
        raise TemporalSettingsError(f"{_setting('temporal_api_key_file')}: {config.temporal_api_key_file} is empty")
    return key


def _client_pair(config: DurafixConfig) -> tuple[bytes | None, bytes | None]:
    """The mTLS client certificate and key, both or neither, checked to be PEM and to belong together."""
    cert_path, key_path = config.temporal_tls_cert, config.temporal_tls_key
    if not cert_path and not key_path:
        return None, None
    if not (cert_path and key_path):
        pair = ("temporal_tls_cert", "temporal_tls_key")
        given, missing = pair if cert_path else pair[::-1]
        raise TemporalSettingsError(
            f"{_setting(given)} is set but {_setting(missing)} is not: an mTLS client certificate needs its "
            "private key, and a key its certificate"
        )
    cert_file, cert = _read("temporal_tls_cert", cert_path)
    key_file, key = _read("temporal_tls_key", key_path)
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        raise TemporalSettingsError(f"{_setting('temporal_tls_cert')}: {cert_path} holds no PEM certificate")
    if b"ENCRYPTED" in key:
        raise TemporalSettingsError(
            f"{_setting('temporal_tls_key')}: {key_path} is an encrypted private key; give it unencrypted "
            "(readable only by the worker's user), the Temporal SDK takes no passphrase"
        )
    if b"PRIVATE KEY-----" not in key:
        raise TemporalSettingsError(f"{_setting('temporal_tls_key')}: {key_path} holds no PEM private key")
    try:
        # The stdlib's OpenSSL reads both files the way the SDK will, and checks the key is the certificate's.
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert_file, key_file, password=_no_passphrase)
    except ssl.SSLError as err:
        raise TemporalSettingsError(
            f"{_setting('temporal_tls_cert')} and {_setting('temporal_tls_key')}: {cert_path} and {key_path} do "
            f"not make a usable pair ({err.reason or err})"
        ) from err
    return cert, key


def _no_passphrase() -> str:
    raise TemporalSettingsError("the client private key asks for a passphrase; give it unencrypted")


def _ca(path: str) -> bytes:
    data = _read("temporal_tls_ca", path)[1]
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as err:
        raise TemporalSettingsError(
            f"{_setting('temporal_tls_ca')}: {path} holds no PEM CA certificate ({err})"
        ) from err
    return data


def _read(field: str, path_text: str) -> tuple[Path, bytes]:
    """The file a setting names (``~`` expanded; it must be absolute) and its bytes."""
    path = Path(path_text).expanduser()
    if not path.is_absolute():
        raise TemporalSettingsError(
            f"{_setting(field)}: {path_text!r} is not an absolute path (a worker may start in any directory)"
        )
    try:
        return path, path.read_bytes()
    except OSError as err:
        raise TemporalSettingsError(f"{_setting(field)}: cannot read {path}: {err.strerror or err}") from err


async def connect(config: DurafixConfig, *, runtime: Runtime | None = None) -> Client:
    """The one way a durafix process (worker, CLI, webhook receiver) connects: address, namespace, TLS and API
    key from ``config`` (:func:`connect_options`, whose
    :class:`TemporalSettingsError` is raised before any connection is tried), with
    the tracing interceptor (:mod:`pipeline.tracing`), which carries a trace into the runs it starts and
    commands and, on a worker built on the client, through the workflow to its activities. ``runtime``: the SDK
    runtime to connect with (a worker's, exporting its metrics); None: the default one."""
    options = connect_options(config)
    return await Client.connect(
        options.target_host,
        namespace=options.namespace,
        tls=options.tls,
        api_key=options.api_key,
        data_converter=pydantic_data_converter,
        interceptors=tracing.interceptors(),
        runtime=runtime,
    )
