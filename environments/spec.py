"""Recipes and recovery specs: reading ``durafix.yaml``, hashing dependency locks, canonical serialisation.

A :class:`~environments.interface.RecoverySpec` is the recorded input from which any worker rebuilds an
environment. The caller stores :func:`canonical_json` in the evidence store and refers to it by
:func:`spec_digest`, which is the sha256 of exactly those bytes, so equal specs always share one reference.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from environments.interface import AppRecipe, EnvironmentError, RecoverySpec
from environments.secrets import parse_secret_ref

RECIPE_FILE = "durafix.yaml"


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
    return recipe


def dependency_lock_hash(repo_dir: Path, recipe: AppRecipe) -> str | None:
    """sha256 over the recipe's lock files (sorted by path; each framed by its path and length).

    ``None`` when the recipe declares no lock files. A declared lock file that is missing is a recipe
    error, not an empty file.
    """
    if not recipe.lock_files:
        return None
    digest = hashlib.sha256()
    for name in sorted(set(recipe.lock_files)):
        try:
            content = (repo_dir / name).read_bytes()
        except FileNotFoundError:
            raise RecipeError(f"lock file {name} declared in {RECIPE_FILE} does not exist") from None
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


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
