from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from environments.diagnosis import FailedCommand, Stage
from environments.interface import NoAppError, ReadinessProbe, app_start
from environments.spec import (
    RecipeError,
    build_recovery_spec,
    cached_paths,
    canonical_json,
    load_recipe,
    spec_digest,
    spec_from_json,
)
from tests.support.gitrepo import CART_APP

REVISION = "3f" * 20


def write_recipe(tmp_path: Path, text: str) -> Path:
    (tmp_path / "durafix.yaml").write_text(text)
    return tmp_path


def test_the_sample_app_recipe_loads() -> None:
    recipe = load_recipe(CART_APP)
    assert recipe.start is not None and "$PORT" in recipe.start
    assert recipe.readiness.path == "/healthz"
    assert recipe.readiness.deadline_s == 20
    assert recipe.limits.memory_mb == 256
    assert recipe.test.startswith("python3 -m unittest")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("start: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "must be a mapping"),
        ("start: s\n", "test: Field required"),
        ("start: s\ntest: t\nstrat: typo\n", "unknown keys: strat"),
        ("start: s\ntest: t\nreadiness:\n  pth: /x\n", "unknown keys: readiness.pth"),
        ("start: s\ntest: t\nreadiness:\n  deadline_s: soon\n", "readiness.deadline_s"),
        ("start: s\ntest: t\nsecrets:\n  API_KEY: vault:x\n", "secrets.API_KEY"),
        ("start: s\ntest: t\nlock_files: [../outside.lock]\n", "inside the repository"),
        ("start: s\ntest: t\ncache: [/opt/node_modules]\n", "cache: '/opt/node_modules' must be a path inside"),
        ("start: s\ntest: t\ncache: [../node_modules]\n", "cache: '../node_modules' must be a path inside"),
        ("start: s\ntest: t\ncache: [.git/hooks]\n", "outside .git"),
        ("start: s\ntest: t\ncache: [.]\n", "cache: '.' must be a path inside"),
        ("start: s\ntest: t\ncache: [node_modules, node_modules/.cache]\n", "is inside 'node_modules'"),
    ],
)
def test_an_invalid_recipe_is_refused_with_the_reason(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(RecipeError, match=r"durafix\.yaml") as info:
        load_recipe(write_recipe(tmp_path, text))
    assert message in str(info.value)


def test_a_recipe_without_start_is_valid_and_one_with_start_keeps_it(tmp_path: Path) -> None:
    """``start`` is needed only by what needs the app running: a recipe of commands and tests alone loads (its
    readiness keeps its default, meaningless without an app), and its spec round-trips; one with ``start`` reads
    as before."""
    library = load_recipe(write_recipe(tmp_path, "setup: [make deps]\ntest: make test\n"))
    assert library.start is None and library.test == "make test" and library.setup == ["make deps"]
    assert (library.port, library.readiness) == (8000, ReadinessProbe())
    # What needs the app is refused, naming the stage (no command: none was declared) and what to add.
    with pytest.raises(NoAppError, match="declares no `start`") as refused:
        app_start(library)
    assert refused.value.failed == FailedCommand(Stage.START, "") and "add `start`" in str(refused.value)
    spec = build_recovery_spec("acme/tiny", "u", REVISION, tmp_path)
    assert spec_from_json(canonical_json(spec)) == spec and json.loads(canonical_json(spec))["recipe"]["start"] is None

    app = load_recipe(write_recipe(tmp_path, "start: ./serve --port $PORT\ntest: make test\nreadiness: {path: /up}\n"))
    assert app.start == "./serve --port $PORT" and app.readiness.path == "/up"
    assert app_start(app) == "./serve --port $PORT"


def test_a_missing_recipe_is_reported(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path)


def test_a_spec_without_lock_files_has_no_lock_hash() -> None:
    spec = build_recovery_spec("acme/cart", "https://example.com/acme/cart.git", REVISION, CART_APP)
    assert spec.dependency_lock_hash is None
    assert spec.recipe == load_recipe(CART_APP)


def test_the_lock_hash_follows_lock_file_contents_only(tmp_path: Path) -> None:
    repo = write_recipe(tmp_path, "start: s\ntest: t\nlock_files: [requirements.lock, web/package-lock.json]\n")
    (repo / "web").mkdir()
    (repo / "requirements.lock").write_text("httpx==0.28.1\n")
    (repo / "web" / "package-lock.json").write_text("{}\n")

    def lock_hash() -> str | None:
        return build_recovery_spec("acme/cart", "u", REVISION, repo).dependency_lock_hash

    first = lock_hash()
    assert first is not None and len(first) == 64
    (repo / "README.md").write_text("unrelated change\n")
    assert lock_hash() == first
    write_recipe(tmp_path, "start: s\ntest: t\nlock_files: [web/package-lock.json, requirements.lock]\n")
    assert lock_hash() == first
    (repo / "requirements.lock").write_text("httpx==0.28.2\n")
    assert lock_hash() != first


def test_without_declared_lock_files_the_recognised_ones_at_the_root_are_hashed(tmp_path: Path) -> None:
    repo = write_recipe(tmp_path, "start: s\ntest: t\n")
    assert build_recovery_spec("acme/cart", "u", REVISION, repo).dependency_lock_hash is None
    (repo / "package-lock.json").write_text("{}\n")
    (repo / "requirements-dev.txt").write_text("pytest==8.3.4\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "yarn.lock").write_text("")

    recognised = build_recovery_spec("acme/cart", "u", REVISION, repo).dependency_lock_hash
    write_recipe(tmp_path, "start: s\ntest: t\nlock_files: [requirements-dev.txt, package-lock.json]\n")
    assert recognised is not None
    assert build_recovery_spec("acme/cart", "u", REVISION, repo).dependency_lock_hash == recognised
    (repo / "sub" / "yarn.lock").write_text("changed, but not at the root\n")
    write_recipe(tmp_path, "start: s\ntest: t\n")
    assert build_recovery_spec("acme/cart", "u", REVISION, repo).dependency_lock_hash == recognised


def test_declared_cached_paths_are_normalised_and_an_undeclared_cache_is_none(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, "start: s\ntest: t\ncache: [./node_modules/, web/.venv]\n"))
    assert cached_paths(recipe, ["package-lock.json"]) == ["node_modules", "web/.venv"]
    assert load_recipe(write_recipe(tmp_path, "start: s\ntest: t\n")).cache is None


def test_a_declared_lock_file_must_exist(tmp_path: Path) -> None:
    repo = write_recipe(tmp_path, "start: s\ntest: t\nlock_files: [uv.lock]\n")
    with pytest.raises(RecipeError, match=r"uv\.lock"):
        build_recovery_spec("acme/cart", "u", REVISION, repo)


def test_the_digest_is_the_sha256_of_the_canonical_json_and_round_trips() -> None:
    spec = build_recovery_spec("acme/cart", "https://example.com/acme/cart.git", REVISION, CART_APP)
    data = canonical_json(spec)

    assert spec_digest(spec) == hashlib.sha256(data).hexdigest()
    assert data == json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
    assert spec_from_json(data) == spec
    assert canonical_json(spec_from_json(data)) == data
    assert spec_digest(spec.model_copy(update={"base_revision": "4e" * 20})) != spec_digest(spec)
