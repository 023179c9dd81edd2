"""Run a short command in an image and read what it printed, without docker-py's race.

``client.containers.run(..., remove=True)`` follows the container's log stream and joins it only after
the container is removed; for a command that exits at once the stream can end before the engine has
copied the output, and the call returns ``b""`` with exit status 0. Waiting for the exit first and then
reading the (complete, stored) logs has no such window.
"""

from __future__ import annotations

import docker
from docker.errors import ContainerError


def run_in_image(client: docker.DockerClient, image: str, command: list[str], *, user: str | None = None) -> bytes:
    """Run ``command`` in ``image`` with no network; return its stdout, raise ``ContainerError`` on failure."""
    container = client.containers.create(image, command, network_mode="none", user=user)
    try:
        container.start()
        status = int(container.wait()["StatusCode"])
        out = bytes(container.logs(stdout=True, stderr=False))
        if status != 0:
            err = bytes(container.logs(stdout=False, stderr=True))
            raise ContainerError(container, status, command, image, err)
        return out
    finally:
        container.remove(force=True)


def sh_in_image(client: docker.DockerClient, image: str, script: str, *, user: str | None = None) -> str:
    """``run_in_image`` for a shell script, decoded."""
    return run_in_image(client, image, ["/bin/sh", "-c", script], user=user).decode()
