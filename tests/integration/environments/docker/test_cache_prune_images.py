"""``durafix cache prune`` on Docker images, against the session's real engine.

The command is pointed at the engine through a worker configuration (``docker_host``) and so judges images by
the stamps in that worker's image cache (``STATE/environments/cache``). The app images pruned here are built
in the test from copies of the sample app, on the session's base image (imported once from the shared root
filesystem tarball; nothing is bootstrapped). The shared tarball and the base image are never pruned: their
last use in the worker's cache is the builds below, and the base is what the kept images are built on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from docker.errors import ImageNotFound, NotFound

from environments.docker import DockerProvider
from environments.docker.images import ImageBuilder, rootfs_stamp_path, stamp_path
from environments.interface import AppRecipe
from infra.docker.engine import DockerEngine
from pipeline.cli import run_command
from pipeline.config import DurafixConfig

pytestmark = [pytest.mark.docker, pytest.mark.slow]

DAY = 86400.0


def age(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(path, (then, then))


@dataclass
class Images:
    """App images built in a worker's image cache: ``unused``, ``stopped`` (a stopped container uses it),
    ``tagged`` (someone else tagged it too) are old; ``fresh`` was just used. ``base`` is the session's."""

    client: docker.DockerClient
    builder: ImageBuilder
    base: str
    tags: dict[str, str]
    workspaces: dict[str, Path]
    container: str

    def present(self, name: str) -> bool:
        try:
            self.client.images.get(self.tags[name])
        except ImageNotFound:
            return False
        return True


@pytest.fixture
def worker_state(tmp_path: Path, docker_engine: DockerEngine, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A worker's state directory whose configuration names the session's engine."""
    state_dir = tmp_path / "state"
    DurafixConfig(state_dir=state_dir, docker_host=docker_engine.docker_host, environment_provider="docker").save()
    for var in ("DURAFIX_DOCKER_HOST", "DOCKER_HOST", "DURAFIX_ENVIRONMENT_PROVIDER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DURAFIX_STATE_DIR", str(state_dir))
    return state_dir


@pytest.fixture
def images(
    provider: DockerProvider,
    docker_client: docker.DockerClient,
    cart_recipe: AppRecipe,
    cart_workspace: Path,
    worker_state: Path,
    tmp_path: Path,
) -> Iterator[Images]:
    base = provider.images.ensure_base(cart_recipe.image)
    # The image cache the worker with this state directory uses (see pipeline.services and DockerProvider).
    builder = ImageBuilder(docker_client, worker_state / "environments" / "cache")
    tags: dict[str, str] = {}
    workspaces: dict[str, Path] = {}
    marker = uuid.uuid4().hex
    for name in ("unused", "stopped", "tagged", "fresh"):
        workspaces[name] = tmp_path / name
        shutil.copytree(cart_workspace, workspaces[name])
        # A file of its own makes each a distinct image, built here and nowhere else.
        (workspaces[name] / "marker.txt").write_text(f"{marker} {name}\n")
        tags[name] = builder.ensure_app(cart_recipe, workspaces[name])
    docker_client.images.get(tags["tagged"]).tag("someone/else", marker)
    container = docker_client.containers.run(tags["stopped"], ["true"], network_mode="none", detach=True)
    container.wait(timeout=60)
    container.reload()
    assert container.status == "exited"
    for name in ("unused", "stopped", "tagged"):
        age(stamp_path(builder.cache_dir, tags[name]), 30)
    result = Images(docker_client, builder, base, tags, workspaces, container.name)
    try:
        yield result
    finally:
        with contextlib.suppress(NotFound):
            container.remove(force=True)
        with contextlib.suppress(NotFound):
            docker_client.images.remove(f"someone/else:{marker}")
        for tag in tags.values():
            with contextlib.suppress(NotFound):
                docker_client.images.remove(tag, force=True)


def prune(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object], str]:
    capsys.readouterr()
    code = run_command(["cache", "prune", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def named(entries: object, names: dict[str, str]) -> dict[str, dict[str, str]]:
    """The entries of ``names``' tags, by their short name."""
    assert isinstance(entries, list)
    tags = {tag: short for short, tag in names.items()}
    return {tags[name]: entry for entry in entries for name in entry["name"].split(", ") if name in tags}


def test_serving_an_image_stamps_it_its_base_and_the_bases_rootfs_tarball(
    provider: DockerProvider, cart_recipe: AppRecipe, images: Images
) -> None:
    app_stamp = stamp_path(images.builder.cache_dir, images.tags["unused"])
    base_stamp = stamp_path(images.builder.cache_dir, images.base)
    # The shared tarball's stamp is only aged here, and refreshed again right below.
    tarball_stamp = rootfs_stamp_path(provider.images.rootfs_tarball(cart_recipe.image))
    for stamp in (app_stamp, base_stamp, tarball_stamp):
        age(stamp, 30)

    assert images.builder.ensure_app(cart_recipe, images.workspaces["unused"]) == images.tags["unused"]
    provider.images.ensure_base(cart_recipe.image)

    for stamp in (app_stamp, base_stamp, tarball_stamp):
        assert time.time() - stamp.stat().st_mtime < 60, stamp


def test_old_unused_images_go_and_an_image_a_stopped_container_uses_stays(
    images: Images, capsys: pytest.CaptureFixture[str]
) -> None:
    code, document, _ = prune([], capsys)

    assert code == 0 and document["images_checked"] is True
    eligible = named(document["eligible"], images.tags)
    assert set(eligible) == {"unused", "tagged"}
    assert eligible["unused"]["kind"] == "image" and eligible["unused"]["last_used_from"] == "stamp"
    kept = named(document["kept"], {**images.tags, "base": images.base})
    assert kept["stopped"]["reason"] == f"in use: container {images.container} (exited)"
    assert kept["fresh"]["reason"] == "used within 14d"
    assert kept["base"]["reason"].startswith("in use: base of ")
    assert all(images.present(name) for name in images.tags)

    code, document, _ = prune(["--yes"], capsys)

    # Someone else's tag makes the engine refuse to remove that image: it is named with the engine's error,
    # and the other planned image is removed anyway.
    assert code == 1
    assert set(named(document["removed"], images.tags)) == {"unused"}
    remaining = named(document["remaining"], images.tags)
    assert set(remaining) == {"tagged"} and "must be forced" in remaining["tagged"]["reason"]
    assert not images.present("unused")
    assert images.present("stopped") and images.present("tagged") and images.present("fresh")
    images.client.images.get(images.base)
    assert not stamp_path(images.builder.cache_dir, images.tags["unused"]).exists()


def test_the_text_output_names_what_could_not_be_removed_with_the_engines_error(
    images: Images, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = run_command(["cache", "prune", "--yes"])
    out = capsys.readouterr().out

    assert code == 1
    assert "unused for more than 14d: 1 removed, 0 skipped, 1 could not be removed" in out
    removed = out.split("removed:\n", 1)[1].split("could not be removed:\n", 1)[0]
    assert images.tags["unused"] in removed
    [error] = [line for line in out.splitlines() if line.startswith("error: image ")]
    assert images.tags["tagged"] in error and "someone/else:" in error and "must be forced" in error
    assert out.count("fix the cause above, then run again: durafix cache prune --older-than 14d --yes") == 1
