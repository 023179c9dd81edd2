"""How durafix connects to Temporal: the connect arguments built from the configuration (TLS, mTLS client
certificate, server name, API key), the half configurations refused before any connection is tried, and real
connections over TLS and mTLS to the real Temporal dev server behind a TLS terminator (the dev server has no
TLS options of its own), with certificates from a throwaway CA."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetSystemInfoRequest
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment

from pipeline.config import DurafixConfig, load_config
from pipeline.temporal_connection import ConnectOptions, TemporalSettingsError, connect, connect_options
from tests.support.durafix_cli import run_durafix
from tests.support.throwaway_ca import Issued, ThrowawayCA
from tests.support.tls_proxy import server_context, tls_proxy

SERVER_NAME = "temporal.durafix.test"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> ThrowawayCA:
    return ThrowawayCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def server_cert(ca: ThrowawayCA) -> Issued:
    return ca.issue("server", dns=SERVER_NAME)


@pytest.fixture(scope="module")
def client_cert(ca: ThrowawayCA) -> Issued:
    return ca.issue("worker", client=True)


def config(tmp_path: Path, **settings: object) -> DurafixConfig:
    return DurafixConfig.model_validate({"state_dir": tmp_path, "temporal_address": "temporal:7233", **settings})


def refused(tmp_path: Path, **settings: object) -> str:
    with pytest.raises(TemporalSettingsError) as caught:
        connect_options(config(tmp_path, **settings))
    return str(caught.value)


def test_without_security_settings_the_connection_is_plaintext(tmp_path: Path) -> None:
    options = connect_options(config(tmp_path, temporal_namespace="repairs"))

    assert options == ConnectOptions("temporal:7233", "repairs", False, None)
    assert options.describe() == "temporal:7233 (namespace repairs, plaintext)"


def test_tls_on_alone_verifies_the_server_against_the_system_roots(tmp_path: Path) -> None:
    options = connect_options(config(tmp_path, temporal_tls=True))

    assert options.tls is True and options.api_key is None
    assert options.describe() == "temporal:7233 (namespace default, TLS)"


def test_ca_client_certificate_and_server_name_make_one_tls_config(
    tmp_path: Path, ca: ThrowawayCA, client_cert: Issued
) -> None:
    options = connect_options(
        config(
            tmp_path,
            temporal_tls_ca=str(ca.cert),
            temporal_tls_cert=str(client_cert.cert),
            temporal_tls_key=str(client_cert.key),
            temporal_tls_server_name=SERVER_NAME,
        )
    )

    # TLS is on without being switched on: the files only make sense over it.
    assert options.tls == TLSConfig(
        server_root_ca_cert=ca.cert.read_bytes(),
        domain=SERVER_NAME,
        client_cert=client_cert.cert.read_bytes(),
        client_private_key=client_cert.key.read_bytes(),
    )
    assert options.describe() == (
        f"temporal:7233 (namespace default, TLS, own CA, client certificate, server name {SERVER_NAME})"
    )


def test_an_api_key_turns_tls_on_and_may_come_from_a_file(tmp_path: Path) -> None:
    options = connect_options(config(tmp_path, temporal_api_key="key-123"))

    assert (options.tls, options.api_key) == (True, "key-123")
    assert "key-123" not in options.describe() and options.describe().endswith("TLS, API key)")

    key_file = tmp_path / "api-key"
    key_file.write_text("key-from-file\n")
    options = connect_options(config(tmp_path, temporal_api_key_file=str(key_file)))

    assert (options.tls, options.api_key) == (True, "key-from-file")


def test_settings_come_from_the_environment_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ca: ThrowawayCA, client_cert: Issued
) -> None:
    DurafixConfig(state_dir=tmp_path).save()
    for variable, value in {
        "DURAFIX_TEMPORAL_ADDRESS": "ns.acct.tmprl.cloud:7233",
        "DURAFIX_TEMPORAL_NAMESPACE": "ns.acct",
        "DURAFIX_TEMPORAL_TLS": "1",
        "DURAFIX_TEMPORAL_TLS_CA": str(ca.cert),
        "DURAFIX_TEMPORAL_TLS_CERT": str(client_cert.cert),
        "DURAFIX_TEMPORAL_TLS_KEY": str(client_cert.key),
        "DURAFIX_TEMPORAL_TLS_SERVER_NAME": SERVER_NAME,
    }.items():
        monkeypatch.setenv(variable, value)

    options = connect_options(load_config(tmp_path))

    assert (options.target_host, options.namespace) == ("ns.acct.tmprl.cloud:7233", "ns.acct")
    assert isinstance(options.tls, TLSConfig) and options.tls.client_cert == client_cert.cert.read_bytes()


def test_a_client_certificate_without_its_key_and_a_key_without_its_certificate_are_refused(
    tmp_path: Path, client_cert: Issued
) -> None:
    message = refused(tmp_path, temporal_tls_cert=str(client_cert.cert))

    assert message == (
        "DURAFIX_TEMPORAL_TLS_CERT (temporal_tls_cert) is set but DURAFIX_TEMPORAL_TLS_KEY (temporal_tls_key) is "
        "not: an mTLS client certificate needs its private key, and a key its certificate"
    )
    assert refused(tmp_path, temporal_tls_key=str(client_cert.key)).startswith(
        "DURAFIX_TEMPORAL_TLS_KEY (temporal_tls_key) is set but DURAFIX_TEMPORAL_TLS_CERT (temporal_tls_cert) is not"
    )


def test_files_that_cannot_be_read_or_are_not_what_they_should_be_are_refused_by_name(
    tmp_path: Path, ca: ThrowawayCA, client_cert: Issued
) -> None:
    missing = tmp_path / "missing.pem"
    pair = {"temporal_tls_cert": str(client_cert.cert), "temporal_tls_key": str(client_cert.key)}

    assert refused(tmp_path, temporal_tls_ca=str(missing)) == (
        f"DURAFIX_TEMPORAL_TLS_CA (temporal_tls_ca): cannot read {missing}: No such file or directory"
    )
    assert refused(tmp_path, **{**pair, "temporal_tls_key": str(tmp_path)}) == (
        f"DURAFIX_TEMPORAL_TLS_KEY (temporal_tls_key): cannot read {tmp_path}: Is a directory"
    )
    assert "'certs/worker.pem' is not an absolute path" in refused(
        tmp_path, **{**pair, "temporal_tls_cert": "certs/worker.pem"}
    )
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    assert refused(tmp_path, temporal_tls_ca=str(garbage)).startswith(
        f"DURAFIX_TEMPORAL_TLS_CA (temporal_tls_ca): {garbage} holds no PEM CA certificate"
    )
    assert refused(tmp_path, **{**pair, "temporal_tls_cert": str(garbage)}) == (
        f"DURAFIX_TEMPORAL_TLS_CERT (temporal_tls_cert): {garbage} holds no PEM certificate"
    )
    # The CA's own certificate does not go with the worker's key.
    mismatch = refused(tmp_path, **{**pair, "temporal_tls_cert": str(ca.cert)})
    assert mismatch.startswith(
        "DURAFIX_TEMPORAL_TLS_CERT (temporal_tls_cert) and DURAFIX_TEMPORAL_TLS_KEY (temporal_tls_key): "
    )
    assert "do not make a usable pair" in mismatch and "KEY_VALUES_MISMATCH" in mismatch
    encrypted = tmp_path / "encrypted-key.pem"
    encrypted.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n")
    assert "is an encrypted private key" in refused(tmp_path, **{**pair, "temporal_tls_key": str(encrypted)})
    empty = tmp_path / "empty-api-key"
    empty.write_text("\n")
    assert refused(tmp_path, temporal_api_key_file=str(empty)) == (
        f"DURAFIX_TEMPORAL_API_KEY_FILE (temporal_api_key_file): {empty} is empty"
    )


def test_tls_switched_off_with_tls_settings_or_an_api_key_is_refused(tmp_path: Path, ca: ThrowawayCA) -> None:
    assert refused(tmp_path, temporal_tls=False, temporal_tls_ca=str(ca.cert), temporal_api_key="secret-key") == (
        "DURAFIX_TEMPORAL_TLS (temporal_tls) is off but DURAFIX_TEMPORAL_TLS_CA (temporal_tls_ca), "
        "DURAFIX_TEMPORAL_API_KEY (temporal_api_key) are set: these only work over TLS (an API key is never sent "
        "in the clear); switch TLS on or unset them"
    )
    api_key_file = tmp_path / "api-key"
    api_key_file.write_text("secret-key\n")
    twice = refused(tmp_path, temporal_api_key="secret-key", temporal_api_key_file=str(api_key_file))
    assert twice.startswith("both DURAFIX_TEMPORAL_API_KEY (temporal_api_key) and DURAFIX_TEMPORAL_API_KEY_FILE")
    assert "secret-key" not in twice


def test_the_cli_refuses_a_half_configuration_before_connecting_and_exits_2(
    tmp_path: Path, client_cert: Issued
) -> None:
    # Nothing listens at this address: a connection attempt would fail differently, and later.
    DurafixConfig(state_dir=tmp_path, temporal_address="127.0.0.1:9", temporal_tls_cert=str(client_cert.cert)).save()

    proc = run_durafix(tmp_path, "list")

    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "durafix: DURAFIX_TEMPORAL_TLS_CERT (temporal_tls_cert) is set but DURAFIX_TEMPORAL_TLS_KEY "
        "(temporal_tls_key) is not: an mTLS client certificate needs its private key, and a key its certificate"
    )


async def test_mtls_connects_to_the_real_server_through_a_tls_terminator_that_checks_the_client_certificate(
    tmp_path: Path, temporal_env: WorkflowEnvironment, ca: ThrowawayCA, server_cert: Issued, client_cert: Issued
) -> None:
    upstream = temporal_env.client.service_client.config.target_host
    mtls = server_context(server_cert.cert, server_cert.key, client_ca=ca.cert)
    with tls_proxy(upstream, mtls) as proxy:
        secured = config(
            tmp_path,
            temporal_address=proxy.address,
            temporal_tls_ca=str(ca.cert),
            temporal_tls_cert=str(client_cert.cert),
            temporal_tls_key=str(client_cert.key),
            temporal_tls_server_name=SERVER_NAME,
        )

        client = await asyncio.wait_for(connect(secured), 30)
        described = await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace="default"))

        assert described.namespace_info.name == "default"
        assert proxy.clients and set(proxy.clients) == {"worker"} and proxy.refused == []

        # Without the client certificate the terminator refuses the handshake: mTLS is what let the first in.
        no_cert = secured.model_copy(update={"temporal_tls_cert": "", "temporal_tls_key": ""})
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(connect(no_cert), 30)
        refusals = proxy.refusals(1)
        assert any("certificate" in reason.lower() for reason in refusals), refusals


async def test_tls_verifies_the_server_name_and_the_ca(
    tmp_path: Path, temporal_env: WorkflowEnvironment, ca: ThrowawayCA, server_cert: Issued
) -> None:
    upstream = temporal_env.client.service_client.config.target_host
    with tls_proxy(upstream, server_context(server_cert.cert, server_cert.key, client_ca=None)) as proxy:
        tls = config(tmp_path, temporal_address=proxy.address, temporal_tls_ca=str(ca.cert))

        # The certificate names temporal.durafix.test, not the address dialled: refused without the override.
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(connect(tls), 30)
        # Another CA's certificate: refused with the override too.
        other = ThrowawayCA(tmp_path / "other-ca", name="someone else's CA")
        foreign = tls.model_copy(update={"temporal_tls_ca": str(other.cert), "temporal_tls_server_name": SERVER_NAME})
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(connect(foreign), 30)

        # The client gave up in the handshake each time: the terminator saw it refuse the certificate.
        refusals = proxy.refusals(2)
        assert len(refusals) >= 2 and all("alert" in reason for reason in refusals), refusals

        client = await asyncio.wait_for(connect(tls.model_copy(update={"temporal_tls_server_name": SERVER_NAME})), 30)

        assert (await client.workflow_service.get_system_info(GetSystemInfoRequest())).server_version
