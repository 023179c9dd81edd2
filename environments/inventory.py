"""What runs own across every resource holder, and removing one run's share: the logic behind the on-call
commands ``durafix resources`` and ``durafix cleanup``.

A *holder* is anything that owns resources on behalf of runs and can clean one run up: the local-process
provider (always), the Docker provider (when an engine is configured, the same rule the workers follow) and
the workspace manager. They are built from the settings a worker is built from (its state directory,
environment provider and Docker host) exactly as the worker builds them, so they read the same ownership
records and labels the workers wrote. Which labels are run IDs is the caller's to judge.

Contracts:

- Listing never fails as a whole: a holder that cannot be opened or listed (an unreachable Docker engine, an
  unreadable record) is reported in :attr:`Inventory.unavailable`, and callers must treat the listing as
  incomplete, never as "nothing owned".
- :func:`clean_run` removes one run's resources and nothing else: it calls each holder's ``cleanup_run``,
  which tombstones the run first (nothing can be recreated for it afterwards), is idempotent, and selects by
  the run's own records and labels. A holder that raises is reported; the resources it was listed with in
  the caller's plan are reported as remaining, and the other holders still run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from docker.errors import DockerException

from environments import interface
from environments.interface import CleanupReport, OwnedResource
from environments.registry import get_provider
from environments.workspace import PROVIDER_NAME as WORKSPACE_HOLDER
from environments.workspace import WorkspaceManager

# What a holder raises when its records or its engine cannot be read or changed (OSError covers the HTTP
# client's connection errors, ValueError a torn or foreign record); anything else is a bug and propagates.
HOLDER_ERRORS: tuple[type[Exception], ...] = (interface.EnvironmentError, DockerException, OSError, ValueError)


class ResourceHolder(Protocol):
    def list_owned(self, run_id: str | None = None) -> list[OwnedResource]: ...

    def cleanup_run(self, run_id: str) -> CleanupReport: ...


@dataclass(frozen=True)
class Holder:
    """A holder under the name its resources carry in :attr:`OwnedResource.provider`."""

    name: str
    owner: ResourceHolder


@dataclass(frozen=True)
class Unavailable:
    """A holder whose resources could not be listed or cleaned, and why."""

    name: str
    reason: str


@dataclass
class Inventory:
    resources: list[OwnedResource] = field(default_factory=list)
    unavailable: list[Unavailable] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.unavailable

    def by_run(self) -> dict[str, list[OwnedResource]]:
        """Resources grouped by run ID, runs in sorted order."""
        runs: dict[str, list[OwnedResource]] = {}
        for resource in self.resources:
            runs.setdefault(resource.run_id, []).append(resource)
        return dict(sorted(runs.items()))


def docker_configured(environment_provider: str, docker_host: str) -> bool:
    """Whether a deployment uses a Docker engine: one is named, or Docker is the environment provider."""
    return bool(docker_host) or environment_provider == "docker"


def open_holders(
    state_dir: Path, *, environment_provider: str, docker_host: str
) -> tuple[list[Holder], list[Unavailable]]:
    """The holders a worker with this state directory, environment provider and Docker host (empty: the
    default engine, used only when the provider is Docker) would use, and the configured ones that cannot be
    opened."""
    env_dir = state_dir / "environments"
    holders = [Holder("local", get_provider("local", env_dir))]
    unavailable: list[Unavailable] = []
    if docker_configured(environment_provider, docker_host):
        try:
            holders.append(Holder("docker", get_provider("docker", env_dir, docker_host=docker_host or None)))
        except HOLDER_ERRORS as exc:
            unavailable.append(Unavailable("docker", f"engine not reachable: {exc}"))
    workspaces = WorkspaceManager(cache_dir=state_dir / "cache", root=state_dir / "workspaces")
    holders.append(Holder(WORKSPACE_HOLDER, workspaces))
    return holders, unavailable


def take_inventory(
    holders: Iterable[Holder], unavailable: Iterable[Unavailable] = (), run_id: str | None = None
) -> Inventory:
    """Everything the holders own for ``run_id`` (every run when ``None``); failures go to ``unavailable``."""
    inventory = Inventory(unavailable=list(unavailable))
    for holder in holders:
        try:
            inventory.resources.extend(holder.owner.list_owned(run_id))
        except HOLDER_ERRORS as exc:
            inventory.unavailable.append(Unavailable(holder.name, f"listing failed: {exc}"))
    return inventory


def clean_run(
    holders: Iterable[Holder], run_id: str, planned: Iterable[OwnedResource], unavailable: Iterable[Unavailable] = ()
) -> CleanupReport:
    """Call every holder's ``cleanup_run(run_id)`` and merge the reports.

    ``planned`` is what the caller listed for the run before acting; it only names what is left when a holder
    fails outright. A holder in ``unavailable`` could not be asked, so its share is reported as an error.
    """
    planned = list(planned)
    total = CleanupReport(run_id=run_id)
    for holder in holders:
        try:
            part = holder.owner.cleanup_run(run_id)
        except HOLDER_ERRORS as exc:
            total.remaining.extend(r for r in planned if r.provider == holder.name)
            total.errors.append(f"{holder.name}: cleanup of {run_id} failed: {exc}")
            continue
        total.removed.extend(part.removed)
        total.remaining.extend(part.remaining)
        total.errors.extend(part.errors)
    for missing in unavailable:
        total.errors.append(f"{missing.name}: not cleaned ({missing.reason}); its resources of {run_id} may remain")
    return total


def fully_cleaned(report: CleanupReport) -> bool:
    """Nothing remains and nothing went wrong (a holder error means what is left is unknown)."""
    return not report.remaining and not report.errors


# ---- presentation ---------------------------------------------------------------------------------------

COLUMNS = ("PROVIDER", "KIND", "RESOURCE", "RUN", "OP", "STATUS")


def status_text(resource: OwnedResource) -> str:
    """A short state for humans: process liveness, container status, whether a workspace tree exists."""
    detail = resource.detail
    parts = [detail[key] for key in ("state", "status") if key in detail]
    if "present" in detail:
        parts.append("present" if detail["present"] == "yes" else "tree missing")
    if detail.get("recorded") == "no":
        parts.append("unrecorded")
    if "port" in detail:
        parts.append(f"port {detail['port']}")
    return ", ".join(parts) or "-"


def short_op(resource: OwnedResource) -> str:
    """The operation without its run prefix (``provision`` for ``repair:o/r#1:provision``)."""
    prefix = f"{resource.run_id}:"
    return resource.op_id[len(prefix) :] if resource.op_id.startswith(prefix) else resource.op_id


def resource_row(resource: OwnedResource) -> tuple[str, ...]:
    return (
        resource.provider,
        resource.kind.value,
        resource.resource_id,
        resource.run_id,
        short_op(resource),
        status_text(resource),
    )


def render_resources(resources: Iterable[OwnedResource], *, with_status: bool = True) -> str:
    """The resource table; ``with_status=False`` for resources already removed (their status is history)."""
    if with_status:
        return render_table(resource_row(r) for r in resources)
    return render_table((resource_row(r)[:-1] for r in resources), COLUMNS[:-1])


def render_table(rows: Iterable[tuple[str, ...]], header: tuple[str, ...] = COLUMNS) -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]) for row in table]
    return "\n".join(line.rstrip() for line in lines)


def resource_json(resource: OwnedResource) -> dict[str, object]:
    return resource.model_dump(mode="json")


def unavailable_json(items: Iterable[Unavailable]) -> list[dict[str, str]]:
    return [{"provider": item.name, "reason": item.reason} for item in items]
