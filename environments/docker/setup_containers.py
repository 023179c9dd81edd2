"""A recipe's setup with ``setup_network: true`` on the Docker provider: in containers whose one way out is the
egress proxy, committed into the app image.

A classic image build cannot mount a unix socket, and its ``RUN`` steps get either no network or one of the
engine's (the host's, with every service on it). So when setup needs the network the app image is made in
two parts (:meth:`environments.docker.images.ImageBuilder.ensure_app` holds the tag's build lock throughout):

1. the workspace image, built as before without any network: ``FROM`` the base, the workspace copied to
   ``/app`` owned by the app's user, no setup step;
2. each setup command in a container of its own, started from the previous command's result (the workspace
   image for the first) and committed when it exits 0; the last commit is tagged with the app image's tag.

Each setup container has ``network_mode="none"`` (no interface but loopback: not the host's network, not a
bridge), and the egress proxy's socket (:class:`environments.egress.EgressProxy`, one per setup, started on the
worker and stopped when setup ends) bind-mounted read-only at :data:`environments.egress.INSIDE_SOCKET`, on a
private ``/run`` (so the mount point never becomes part of the image). The command runs behind the same bridge as
the local provider's (:func:`environments.egress.bridged`: the image's ``socat`` listening on the container's
``127.0.0.1:3128`` and forwarding to the socket) with the proxy variables (:data:`environments.egress.PROXY_ENV`)
and ``HOME=/tmp``, so the package managers reach the registries the proxy allows and nothing else. The worker
variables the operator passes to setup (``DURAFIX_SETUP_PASSTHROUGH``: a private index's ``PIP_INDEX_URL``, npm's
registry, as the local provider passes them; :func:`container_passthrough`) come first on that list, so the
proxy variables and the image's own bundle paths are never the worker's: they name places on the worker. They trust
the CA certificates the worker trusts because the image does: its base carries the worker's bundle as a layer
of its own, with the bundle variables pointing at the image's paths (:mod:`environments.docker.trust`), so a
TLS-inspecting proxy or a registry mirror behind an operator's own CA works, as in the local sandbox. The
hardening is the tests' container's: the app's user (``65534:65534``) from the first process on, every
capability dropped (bounding set included), ``no-new-privileges``, a minimal init, the recipe's memory (swap
included), pids and CPU limits, bounded logs; each command is killed after the setup timeout.

A commit keeps exactly the workspace image's configuration (environment, working directory, labels), with the
user ``0:0`` and the command ``/bin/sh`` stated (the engine would otherwise take the setup container's), so the
app and the tests, which always name their user and command, see the same image a classic build makes; none of
the proxy variables, which only the command's own argument list carries, and no socket end up in it.

Each command's output, then the proxy's log since the previous command (``# egress: reached ...`` /
``# egress: refused ...``), go to the caller's log; ``progress`` hears ``setup: <command>`` and which hosts
were reached and refused. A failing command is a :class:`SetupCommandFailed` (its exit or timeout and its
output's tail; the image builder raises it as a ``SetupStepError``), and the images its predecessors committed
are removed. The setup
container has a name derived from the image tag, so one a dead worker left is removed by the next build of the
same tag (under its build lock) before it creates its own; the proxy such a worker left carries the tag's marker
and goes when the next build's does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from docker.types import Mount
from requests.exceptions import RequestException

from environments import egress
from environments.ca_bundle import CA_VARIABLES
from environments.commands import exit_text
from environments.docker.hardening import hardened
from environments.egress import EgressEvent, EgressProxy, log_events
from environments.interface import AppRecipe, Progress
from environments.passthrough import screen
from environments.progress import command_text

APP_USER = "65534:65534"
# The app image's user and command as a classic build leaves them: root (the containers name their own user),
# and a shell (they name their own command).
_COMMITTED_USER = "0:0"
_COMMITTED_CMD = ["/bin/sh"]
_RUN_MOUNT = "rw,nosuid,nodev,noexec,size=1m"
_OUTPUT_TAIL = 40


class SetupCommandFailed(Exception):
    """A setup command exited non-zero or timed out (``detail`` says which, ``output`` is its output's tail)."""

    def __init__(self, command: str, detail: str, output: str, exit_code: int | None = None) -> None:
        super().__init__(f"setup command {command!r} {detail}")
        self.command = command
        self.detail = detail
        self.output = output
        # None: it timed out (``detail`` says so).
        self.exit_code = exit_code


def setup_container_name(key: str) -> str:
    """The setup container named by ``key`` (:meth:`ImageBuilder.setup_key`: the tag and the builder's cache):
    one at a time per tag and cache, which the build lock ensures."""
    return f"durafix-setup-{key}"


def container_passthrough(patterns: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The worker variables matching ``patterns`` that a setup container gets (screened as the local provider's
    are, :func:`environments.passthrough.screen`: a value carrying credentials is withheld), less those the
    container's own arrangement decides: the egress proxy's variables and the CA bundle paths, whose worker
    values point at the worker's proxy and files."""
    own = {name.upper() for name in (*egress.PROXY_ENV, *CA_VARIABLES)}
    return {name: value for name, value in screen(patterns, environ).env.items() if name.upper() not in own}


def run_setup_containers(
    client: docker.DockerClient,
    workspace_image: str,
    recipe: AppRecipe,
    *,
    tag: str,
    key: str,
    app_dir: str,
    hosts: Sequence[str],
    ports: Sequence[int],
    timeout_s: float,
    log_path: Path | None,
    progress: Progress,
    worker_env: Mapping[str, str] | None = None,
) -> tuple[EgressEvent, ...]:
    """Run ``recipe.setup`` on ``workspace_image`` (an image ID) as the module says and tag the result ``tag``;
    the proxy's events. Raises :class:`SetupCommandFailed` for a failing command (nothing is
    tagged then). ``worker_env``: the passed-through worker variables (:func:`container_passthrough`)."""
    config = dict(client.images.get(workspace_image).attrs.get("Config") or {})
    config.update(User=_COMMITTED_USER, Cmd=_COMMITTED_CMD, Entrypoint=None)
    repository, _, version = tag.partition(":")
    name = setup_container_name(key)
    committed: list[str] = []
    current = workspace_image
    logged = 0
    with EgressProxy(hosts, ports=ports, marker=f"docker-setup/{key}/egress", for_container=True) as proxy:
        try:
            for index, command in enumerate(recipe.setup):
                progress(f"setup: {command_text(command)}")
                last = index == len(recipe.setup) - 1
                container = _create(
                    client, name, current, recipe, command, proxy.socket_path, app_dir, worker_env or {}
                )
                try:
                    code = _run(container, timeout_s)
                    output = bytes(container.logs(stdout=True, stderr=True))
                    if log_path is not None:
                        with log_path.open("ab") as log:
                            log.write(f"$ {command}\n".encode() + output)
                    events = proxy.events()
                    log_events(events[logged:], log_path, progress)
                    logged = len(events)
                    if code != 0:
                        text = output.decode(errors="replace")
                        tail_text = "\n".join(text.splitlines()[-_OUTPUT_TAIL:])
                        raise SetupCommandFailed(command, exit_text(code), tail_text, exit_code=code)
                    image = container.commit(
                        repository=repository if last else None, tag=version if last else None, conf=config
                    )
                    current = str(image.id)
                    if not last:
                        committed.append(current)
                finally:
                    with contextlib.suppress(NotFound):
                        container.remove(force=True)
        except BaseException:
            # Nothing of a setup that did not finish stays: the commits before the failing command go too.
            for image_id in reversed(committed):
                with contextlib.suppress(ImageNotFound, APIError):
                    client.images.remove(image_id, noprune=False)
            raise
        return tuple(proxy.events())


def _create(
    client: docker.DockerClient,
    name: str,
    image: str,
    recipe: AppRecipe,
    command: str,
    socket_path: Path,
    app_dir: str,
    worker_env: Mapping[str, str],
) -> Any:
    with contextlib.suppress(NotFound):
        # A dead worker's setup container for the same tag (this build holds the tag's lock): not ours to reuse.
        client.containers.get(name).remove(force=True)
    proxied = [f"{variable}={value}" for variable, value in egress.PROXY_ENV.items()]
    passed = [f"{variable}={value}" for variable, value in worker_env.items()]
    argv = egress.bridged(["/usr/bin/env", "HOME=/tmp", *passed, *proxied, "/bin/sh", "-c", command])
    mounts = [Mount(egress.INSIDE_SOCKET, str(socket_path.absolute()), type="bind", read_only=True)]
    limits = recipe.limits
    return client.containers.create(
        image,
        argv,
        name=name,
        user=APP_USER,
        working_dir=app_dir,
        network_mode="none",
        mounts=mounts,
        tmpfs={"/run": _RUN_MOUNT},
        **hardened(limits),
    )


def _run(container: Any, timeout_s: float) -> int | None:
    """Start ``container`` and wait for it: its exit code, or ``None`` when it was killed at ``timeout_s``."""
    container.start()
    try:
        return int(container.wait(timeout=timeout_s)["StatusCode"])
    except RequestException:
        with contextlib.suppress(APIError):
            container.kill()
        with contextlib.suppress(APIError, RequestException):
            container.wait(timeout=30)
        return None
