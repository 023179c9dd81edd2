"""Base and app images: apt sources, content addressing, the root filesystem cache, offline app builds."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from environments.docker import DockerProvider
from environments.docker.images import ImageBuilder, ImageBuildError, apt_mirror, recipe_hash, tree_digest
from environments.interface import AppRecipe, ImageRecipe
from infra.docker.engine import DockerEngine
from tests.support.containers import run_in_image, sh_in_image


def test_apt_mirror_reads_deb822_sources_for_the_suite(tmp_path: Path) -> None:
    listing = tmp_path / "sources.list.d"
    listing.mkdir()
    (listing / "cloud.list").write_text("deb https://packages.example.invalid/apt cloud-bookworm main\n")
    (listing / "debian.sources").write_text(
        "# disabled below\nTypes: deb\nURIs: http://old.example.invalid/debian\nSuites: bookworm\n"
        "Components: main\nEnabled: no\n\n"
        "Types: deb deb-src\nURIs: http://mirror.example.invalid/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main contrib\n"
    )
    assert apt_mirror("bookworm", tmp_path) == "http://mirror.example.invalid/debian"


def test_apt_mirror_reads_one_line_entries_with_options(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "deb-src http://src.example.invalid/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example.invalid/debian bookworm main  # primary\n"
    )
    assert apt_mirror("bookworm", tmp_path) == "http://mirror.example.invalid/debian"


def test_apt_mirror_without_a_source_for_the_suite_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb http://mirror.example.invalid/debian bullseye main\n")
    with pytest.raises(ImageBuildError, match="bookworm"):
        apt_mirror("bookworm", tmp_path)


def test_recipe_hash_ignores_package_order_and_duplicates_but_not_the_set() -> None:
    one = recipe_hash(ImageRecipe(packages=["python3", "curl"]))
    assert one == recipe_hash(ImageRecipe(packages=["curl", "python3", "curl"]))
    assert one != recipe_hash(ImageRecipe(packages=["python3"]))
    assert len(one) == 12


def test_recipe_hash_refuses_what_is_not_a_package_name() -> None:
    with pytest.raises(ValueError, match="package"):
        recipe_hash(ImageRecipe(packages=["python3,--foreign"]))


def test_tree_digest_follows_content_and_executability_but_not_git_metadata(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("print('hi')\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    first = tree_digest(tmp_path)

    (tmp_path / ".git" / "HEAD").write_text("0" * 40 + "\n")
    assert tree_digest(tmp_path) == first
    (tmp_path / "app.py").chmod(0o755)
    executable = tree_digest(tmp_path)
    assert executable != first
    (tmp_path / "app.py").write_text("print('hello')\n")
    assert tree_digest(tmp_path) not in {first, executable}


@pytest.fixture
def fresh_engine(
    docker_engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[docker.DockerClient]:
    """A second engine with an empty data root (short state path: containerd's socket limit)."""
    engine = DockerEngine(tmp_path_factory.mktemp("e"))
    client = docker.DockerClient(base_url=engine.ensure_running(), timeout=300)
    yield client
    client.close()
    engine.stop()


@pytest.mark.docker
@pytest.mark.slow
def test_empty_engine_imports_the_cached_root_filesystem_without_bootstrapping(
    provider: DockerProvider, cart_recipe: AppRecipe, fresh_engine: docker.DockerClient
) -> None:
    provider.images.ensure_base(cart_recipe.image)
    # An unreachable mirror: bootstrapping again would fail.
    offline = ImageBuilder(fresh_engine, provider.images.cache_dir, mirror="http://127.0.0.1:9/debian")

    tag = offline.ensure_base(cart_recipe.image)

    output = run_in_image(fresh_engine, tag, ["python3", "-c", "print(6 * 7)"])
    assert output == b"42\n"
    assert fresh_engine.images.get(tag).labels["durafix.recipe"] == recipe_hash(cart_recipe.image)


@pytest.mark.docker
@pytest.mark.slow
def test_app_image_runs_setup_without_network_and_is_reused_until_the_workspace_changes(
    provider: DockerProvider, cart_recipe: AppRecipe, cart_workspace: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    shutil.copytree(cart_workspace, workspace)
    setup = "python3 -c 'import cart' && echo built > built.txt"
    recipe = cart_recipe.model_copy(update={"setup": [setup]})
    client = provider.client
    building: list[str] = []
    reusing: list[str] = []

    tag = provider.images.ensure_app(recipe, workspace, progress=building.append)
    image_id = client.images.get(tag).id
    assert provider.images.ensure_app(recipe, workspace, progress=reusing.append) == tag
    assert client.images.get(tag).id == image_id
    # The base image may be built first (when no earlier test did); the setup step is seen as it begins.
    *base, build, step = building
    assert all(text.startswith(("building base image ", "importing base image ")) for text in base), base
    assert [build, step] == [f"building image {tag}", f"setup: {setup}"]
    assert reusing == []
    built = run_in_image(client, tag, ["cat", "/app/built.txt"])
    assert built == b"built\n"

    (workspace / "cart.py").write_text((workspace / "cart.py").read_text() + "\n# changed\n")
    assert provider.images.ensure_app(recipe, workspace) != tag

    online = recipe.model_copy(
        update={"setup": ["python3 -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), timeout=5)'"]}
    )
    with pytest.raises(ImageBuildError, match="unreachable"):
        provider.images.ensure_app(online, workspace)


@pytest.mark.docker
@pytest.mark.slow
def test_a_tree_with_the_same_lock_files_reuses_the_dependency_image_without_running_setup(
    provider: DockerProvider, cart_recipe: AppRecipe, cart_workspace: Path, tmp_path: Path
) -> None:
    # setup "installs" from the lock file into .venv, and says so in a file of its own.
    setup = "mkdir -p .venv && cp requirements.txt .venv/installed && date +%s%N > .venv/when"
    recipe = cart_recipe.model_copy(update={"setup": [setup]})
    first, second = tmp_path / "first", tmp_path / "second"
    for ws in (first, second):
        shutil.copytree(cart_workspace, ws)
        (ws / "requirements.txt").write_text("six==1.16.0\n")
    (first / "only-in-first.txt").write_text("the first tree\n")
    (second / "cart.py").write_text((second / "cart.py").read_text() + "\n# the second tree\n")
    client = provider.client
    building: list[str] = []
    reusing: list[str] = []

    first_tag = provider.images.ensure_app(recipe, first, progress=building.append)
    deps = provider.images.deps_tag(recipe, second, provider.images.ensure_base(recipe.image))
    assert deps is not None and deps[1] == [".venv"]
    second_tag = provider.images.ensure_app(recipe, second, progress=reusing.append)

    assert f"setup: {setup}" in building
    assert second_tag != first_tag
    assert reusing == [f"setup: reusing .venv from image {deps[0]} (same lock files and setup)"]

    def run(tag: str, command: str) -> str:
        return sh_in_image(client, tag, command)

    # The second image has the first's installed dependencies, its own tree, and nothing left of the first tree.
    assert run(second_tag, "cat .venv/when") == run(first_tag, "cat .venv/when")
    assert run(second_tag, "cat .venv/installed") == "six==1.16.0\n"
    assert "# the second tree" in run(second_tag, "cat cart.py")
    assert run(second_tag, "ls only-in-first.txt 2>&1 || true").strip().endswith("No such file or directory")

    # Another lock file: no reuse, setup runs.
    (second / "requirements.txt").write_text("six==1.17.0\n")
    again: list[str] = []
    provider.images.ensure_app(recipe, second, progress=again.append)
    assert f"setup: {setup}" in again
