"""Whether a Docker image build reaches the package registries with the configured trust: one real ``pip
download`` in a setup container, as a recipe's networked setup runs.

:func:`try_registries` builds a throwaway app image with :class:`~environments.docker.images.ImageBuilder`, so it
goes exactly the way a recipe's ``setup_network: true`` does: the base image (:data:`PACKAGES`, with the egress
packages), the worker's CA layer (:mod:`environments.docker.trust`), and :data:`COMMAND` in a setup container
whose one way out is the egress proxy with the worker's allowed hosts. The workspace holds a fresh marker, so the
command really runs every time; the image is removed afterwards (the base and the CA layer stay cached, as for any
build). A failure is judged by :func:`environments.diagnosis.diagnose`, so an untrusted certificate names
``DURAFIX_CA_BUNDLE`` and a refused host ``DURAFIX_SETUP_EGRESS``; the log keeps the command's output.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from pathlib import Path

from docker.errors import APIError, ImageNotFound

from environments.ca_bundle import CABundleError
from environments.commands import tail
from environments.diagnosis import diagnose
from environments.docker.images import ImageBuilder, ImageBuildError, SetupStepError
from environments.interface import AppRecipe, ImageRecipe, Progress
from environments.progress import ignore

PACKAGES = ["python3", "python3-pip"]
# A small package with no dependencies, from PyPI's index and file host; --retries 0: a refusal is said at once.
COMMAND = "python3 -m pip download --no-deps --no-cache-dir --retries 0 --dest /tmp/durafix-check six"
_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RegistryReach:
    """What the check found: whether the download succeeded, and the sentence saying so (the hosts reached, or
    the problem and its fix); ``log`` keeps the build's output."""

    reached: bool
    detail: str
    log: Path


def try_registries(builder: ImageBuilder, work_dir: Path, progress: Progress | None = None) -> RegistryReach:
    """Run :data:`COMMAND` as a networked setup on ``builder``'s engine (see the module); ``work_dir`` holds the
    workspace and the log. Never raises for what the build finds: that is the answer."""
    work_dir.mkdir(parents=True, exist_ok=True)
    workspace = work_dir / f"workspace-{uuid.uuid4().hex[:12]}"
    workspace.mkdir()
    (workspace / "marker").write_text(workspace.name)  # a tree new to the engine: the command runs
    log = work_dir / "registry-check.log"
    log.write_text("")
    recipe = AppRecipe(setup=[COMMAND], setup_network=True, test="true", image=ImageRecipe(packages=PACKAGES))
    try:
        tag = builder.ensure_app(
            recipe, workspace, progress=progress or ignore, log_path=log, setup_timeout_s=_TIMEOUT_S
        )
    except CABundleError as err:
        return RegistryReach(False, str(err), log)
    except SetupStepError as err:
        found = diagnose(err.failed, tail(log)) if err.failed is not None else None
        said = str(err).splitlines()[0]
        return RegistryReach(False, f"{said}: {found.hint}" if found else f"{said}; its output is in {log}", log)
    except ImageBuildError as err:
        return RegistryReach(False, f"the check's image could not be built: {str(err).splitlines()[0]}", log)
    with contextlib.suppress(ImageNotFound, APIError):
        builder.client.images.remove(tag, noprune=False)
    reached = sorted({f"{e.host}:{e.port}" for e in builder.last_egress if e.verdict == "reached"})
    return RegistryReach(True, f"pip download reached {', '.join(reached)} from a setup container", log)
