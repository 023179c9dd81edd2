"""Whether a Docker engine answers: its ``_ping`` and its version, with a short timeout (a worker's start
check, not a provider: :class:`environments.docker.provider.DockerProvider` talks to the engine for real)."""

from __future__ import annotations

import docker
from docker.errors import DockerException
from requests.exceptions import RequestException

from environments.registry import ProviderUnavailableError

PING_TIMEOUT_S = 5.0


def engine_version(host: str, *, timeout_s: float = PING_TIMEOUT_S) -> str:
    """``docker 27.3.1`` for the engine at ``host`` once it answered ``_ping``; else
    :class:`ProviderUnavailableError` saying which host did not answer and why."""
    try:
        # The client asks the engine for its API version as it is built: that is the first request.
        client = docker.DockerClient(base_url=host, timeout=max(1, round(timeout_s)))
        try:
            client.ping()
            version = str(client.version().get("Version", "unknown"))
        finally:
            client.close()
    except (DockerException, RequestException, OSError) as err:
        raise ProviderUnavailableError(f"the Docker engine at {host} does not answer: {err}") from err
    return f"docker {version}"
