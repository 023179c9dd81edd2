"""Recipes and recovery specs: reading ``durafix.yaml``, hashing dependency locks, canonical serialisation.

A :class:`~environments.interface.RecoverySpec` is the recorded input from which any worker rebuilds an
environment. The caller stores :func:`canonical_json` in the evidence store and refers to it by
:func:`spec_digest`, which is the sha256 of exactly those bytes, so equal specs always share one reference.

Lock files are the recipe's ``lock_files`` or, when it declares none, the common ecosystems' lock files found
at the repository root (:data:`JS_LOCK_FILES`, :data:`PYTHON_LOCK_FILES`, ``requirements*.txt``). What they
pin is what the dependency cache (:mod:`environments.depcache`) keys its entries by; :func:`cached_paths` says
which paths those entries hold.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from environments.interface import AppRecipe, EnvironmentError, RecoverySpec
from environments.secrets import parse_secret_ref
from environments.untrusted_files import UntrustedFileError, read_beneath

RECIPE_FILE = "durafix.yaml"

# Recognised at the repository root when the recipe declares no lock files; each installs into the path next to
# it that :func:`cached_paths` caches when the recipe declares no ``cache``.
JS_LOCK_FILES = ("package-lock.json", "yarn.lock", "pnpm-lock.yaml")
PYTHON_LOCK_FILES = ("uv.lock", "poetry.lock")
PYTHON_REQUIREMENTS = "requirements*.txt"
JS_INSTALL_DIR, PYTHON_INSTALL_DIR = "node_modules", ".venv"


class RecipeError(EnvironmentError):
    """``durafix.yaml`` is missing or invalid; the message says where and why."""


def load_recipe(repo_dir: Path) -> AppRecipe:
    """Read and validate ``repo_dir/durafix.yaml``.

    Unknown keys are refused (a misspelt key would otherwise be silently ignored), secret references must
    be ``env:NAME``, and lock files must be relative paths inside the repository.
    """
    path = repo_dir / RECIPE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{path}: not found; the repository must declare its recipe in {RECIPE_FILE}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: must be a mapping of recipe fields, got {type(data).__name__}")
    unknown = _unknown_keys(AppRecipe, data, "")
    if unknown:
        raise RecipeError(f"{path}: unknown keys: {', '.join(unknown)}")
    try:
        recipe = AppRecipe.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
        )
        raise RecipeError(f"{path}: {problems}") from None
    for name, ref in recipe.secrets.items():
        try:
            parse_secret_ref(ref)
        except ValueError as exc:
            raise RecipeError(f"{path}: secrets.{name}: {exc}") from None
    for lock_file in recipe.lock_files:
        pure = PurePosixPath(lock_file)
        if pure.is_absolute() or ".." in pure.parts:
            raise RecipeError(f"{path}: lock_files: {lock_file!r} must be a path inside the repository")
    if recipe.test_report is not None:
        pure = PurePosixPath(recipe.test_report)
        if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] == ".git":
            raise RecipeError(f"{path}: test_report: {recipe.test_report!r} must be a path inside the repository")
    for cached in recipe.cache or []:
        pure = PurePosixPath(cached)
        if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] == ".git":
            raise RecipeError(f"{path}: cache: {cached!r} must be a path inside the repository, outside .git")
    normalised = sorted({str(PurePosixPath(c)) for c in recipe.cache or []})
    for outer in normalised:
        for inner in normalised:
            if inner != outer and PurePosixPath(inner).is_relative_to(outer):
                raise RecipeError(f"{path}: cache: {inner!r} is inside {outer!r}; name each path once")
    return recipe


def lock_files(repo_dir: Path, recipe: AppRecipe) -> list[str]:
    """The lock files the dependency lock hash covers, sorted: the declared ones, else the recognised ones at the
    root of ``repo_dir`` (the ``*_LOCK_FILES`` and ``requirements*.txt``). Declared files are not checked here."""
    if recipe.lock_files:
        return sorted({str(PurePosixPath(name)) for name in recipe.lock_files})
    if not repo_dir.is_dir():
        return []
    return sorted(
        entry.name
        for entry in repo_dir.iterdir()
        if _install_dir(entry.name) is not None and entry.is_file() and not entry.is_symlink()
    )


def lock_file_digests(repo_dir: Path, recipe: AppRecipe) -> dict[str, str]:
    """sha256 of each of :func:`lock_files`; a declared lock file that is missing is a :class:`RecipeError`."""
    return {name: hashlib.sha256(_read_lock(repo_dir, name)).hexdigest() for name in lock_files(repo_dir, recipe)}


def dependency_lock_hash(repo_dir: Path, recipe: AppRecipe) -> str | None:
    """sha256 over :func:`lock_files` (sorted by path; each framed by its path and length).

    ``None`` when there are none (none declared, none recognised). A declared lock file that is missing is a
    recipe error, not an empty file.
    """
    names = lock_files(repo_dir, recipe)
    if not names:
        return None
    digest = hashlib.sha256()
    for name in names:
        content = _read_lock(repo_dir, name)
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def cached_paths(recipe: AppRecipe, locks: list[str]) -> list[str]:
    """The paths a dependency cache entry holds, sorted: the recipe's ``cache`` when it declares one (``[]``:
    nothing is cached), else the install directory next to each recognised lock file in ``locks``
    (``node_modules`` for package-lock.json, yarn.lock, pnpm-lock.yaml; ``.venv`` for uv.lock, poetry.lock,
    requirements*.txt)."""
    if recipe.cache is not None:
        return sorted({str(PurePosixPath(path)) for path in recipe.cache})
    found = set()
    for lock in locks:
        pure = PurePosixPath(lock)
        install = _install_dir(pure.name)
        if install is not None:
            found.add(str(pure.parent / install))
    return sorted(found)


def _install_dir(lock_name: str) -> str | None:
    if lock_name in JS_LOCK_FILES:
        return JS_INSTALL_DIR
    if lock_name in PYTHON_LOCK_FILES or fnmatch.fnmatchcase(lock_name, PYTHON_REQUIREMENTS):
        return PYTHON_INSTALL_DIR
    return None


# Lock files are read again after untrusted code ran (a regression proof's setup): beneath the workspace, with
# no link followed, capped; a FIFO or a link there is an unusable lock file, never a read that blocks or leaks.
MAX_LOCK_BYTES = 128 * 1024 * 1024


def _read_lock(repo_dir: Path, name: str) -> bytes:
    try:
        return read_beneath(repo_dir, name, max_bytes=MAX_LOCK_BYTES)
    except UntrustedFileError as exc:
        if "was not written" in str(exc):
            raise RecipeError(f"lock file {name} declared in {RECIPE_FILE} does not exist") from None
        raise RecipeError(f"lock file {exc}") from None


def build_recovery_spec(repository: str, clone_url: str, base_revision: str, repo_dir: Path) -> RecoverySpec:
    """The spec for ``repository`` at ``base_revision``; ``repo_dir`` must be a checkout of that revision."""
    recipe = load_recipe(repo_dir)
    return RecoverySpec(
        repository=repository,
        clone_url=clone_url,
        base_revision=base_revision,
        recipe=recipe,
        dependency_lock_hash=dependency_lock_hash(repo_dir, recipe),
    )


def canonical_json(spec: RecoverySpec) -> bytes:
    """The spec as canonical JSON: sorted keys, no insignificant whitespace, UTF-8, defaults included."""
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def spec_digest(spec: RecoverySpec) -> str:
    """Hex sha256 of :func:`canonical_json` of ``spec``."""
    return hashlib.sha256(canonical_json(spec)).hexdigest()


def spec_from_json(data: bytes) -> RecoverySpec:
    """Parse a spec stored with :func:`canonical_json`."""
    return RecoverySpec.model_validate_json(data)


def _unknown_keys(model: type[BaseModel], data: dict[str, Any], prefix: str) -> list[str]:
    unknown = []
    for key, value in data.items():
        field = model.model_fields.get(str(key))
        if field is None:
            unknown.append(f"{prefix}{key}")
        elif isinstance(value, dict) and isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            unknown.extend(_unknown_keys(field.annotation, value, f"{prefix}{key}."))
    return unknown
