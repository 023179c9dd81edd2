"""Providers by name. The Docker provider is imported only when asked for, so workers without the Docker
SDK or engine can still run local environments."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from environments.checks import SetupSettings
from environments.interface import EnvironmentError, EnvironmentProvider
from environments.local import LocalProcessProvider
from environments.sandbox import Sandbox

PROVIDERS = ("local", "docker")


class ProviderUnavailableError(EnvironmentError):
    """The named provider exists but cannot be used on this worker."""


def get_provider(
    name: str,
    state_dir: Path,
    *,
    docker_host: str | None = None,
    setup: SetupSettings | None = None,
    unsandboxed: bool = False,
    allowed_secrets: Sequence[str] = (),
) -> EnvironmentProvider:
    """The provider called ``name`` keeping its state under ``state_dir``.

    ``docker_host`` (default: ``$DOCKER_HOST``) is the engine the Docker provider talks to. ``setup`` is how the
    local provider runs setup commands (the Docker provider runs them as image build steps, or in setup
    containers behind the egress proxy when they need the network, cached as images; it takes the egress hosts
    and ports, the CA bundle its images trust and the worker variables setup gets, from it).
    ``unsandboxed``: the operator's explicit permission for the local provider to run commands as plain host
    processes when bubblewrap is unusable (otherwise it refuses, ``SandboxUnavailableError``).
    ``allowed_secrets``: the worker variables a recipe's secrets may name (local provider).
    """
    if name == "local":
        sandbox = Sandbox.detect(unsandboxed=unsandboxed)
        return LocalProcessProvider(state_dir, setup=setup, sandbox=sandbox, allowed_secrets=allowed_secrets)
    if name == "docker":
        host = docker_host or os.environ.get("DOCKER_HOST")
        if not host:
            raise ProviderUnavailableError("the docker provider needs a docker_host (or $DOCKER_HOST)")
        try:
            module = importlib.import_module("environments.docker")
        except ImportError as exc:
            raise ProviderUnavailableError(f"the docker provider cannot be loaded: {exc}") from exc
        # The Docker provider's setup with the network reaches the same hosts as the local provider's.
        if setup is None:
            return cast(EnvironmentProvider, module.DockerProvider(state_dir, host))
        provider = module.DockerProvider(
            state_dir,
            host,
            egress_hosts=setup.egress_hosts,
            egress_ports=setup.egress_ports,
            ca_bundle=setup.ca_bundle,
            passthrough=setup.passthrough,
        )
        return cast(EnvironmentProvider, provider)
    raise ValueError(f"unknown environment provider {name!r}; known: {', '.join(PROVIDERS)}")
