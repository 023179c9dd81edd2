"""A starter ``durafix.yaml`` guessed from what a repository holds (``durafix init``).

Recognised: Node projects (``package.json``, with ``package-lock.json`` / ``npm-shrinkwrap.json``,
``yarn.lock`` or ``pnpm-lock.yaml``) and Python projects (``uv.lock``, ``poetry.lock``, requirements files
anywhere in the tree, a bare ``pyproject.toml`` / ``setup.py``, or just ``*.py`` files). :func:`guess_recipe`
reads files only (it runs nothing) and says, next to the recipe, what it guessed from what and what a
maintainer has to check; :func:`write_recipe` validates the text with :func:`environments.spec.load_recipe`,
the parser every run uses, before writing it.

Contracts of the recipes it writes: setup installs what the test command needs (npm's devDependencies; a
Python project's test extra, test dependency group, test requirements files, and pytest itself when the tests
are pytest's and nothing else installs it); ``cache`` is declared whenever setup installs anything, so the
dependency cache never has to guess an install directory; a project without an app it recognises (a library)
gets no ``start``, ``port`` or ``readiness`` at all, never a command that fails or serves nothing useful: its
reports are reproduced by commands or tests; tests that are pytest's get a ``test_subset`` (pytest with
``{files}``), so a ``test`` reproduction (a reporter's or one the model drafts) can run and the regression proof
runs only the patch's test files.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from environments.interface import AppRecipe, ImageRecipe, ReadinessProbe
from environments.spec import JS_INSTALL_DIR, RECIPE_FILE, RecipeError, dependency_lock_hash, load_recipe

DEFAULT_NODE_PORT = 3000
DEFAULT_PYTHON_PORT = 8000
# npm writes this as `scripts.test` of a new package.json: a test command that always fails.
NPM_PLACEHOLDER_TEST = 'echo "Error: no test specified" && exit 1'
_NODE_LOCKS = (
    ("package-lock.json", "npm"),
    ("npm-shrinkwrap.json", "npm"),
    ("yarn.lock", "yarn"),
    ("pnpm-lock.yaml", "pnpm"),
)
_NODE_INSTALL = {"npm": "npm ci", "yarn": "yarn install --frozen-lockfile", "pnpm": "pnpm install --frozen-lockfile"}
_PORT_IN_SCRIPT = (
    re.compile(r"--port[= ]+(\d{2,5})\b"),
    re.compile(r"(?:^|\s)-p[= ]*(\d{2,5})\b"),
    re.compile(r"\bPORT=(\d{2,5})\b"),
)
_PYTHON_ENTRY_FILES = ("main.py", "app.py", "server.py", "app/main.py", "src/main.py", "src/app.py")


class NothingToGuessError(RecipeError):
    """The directory holds no project :func:`guess_recipe` recognises."""


class RecipeExistsError(RecipeError):
    """``durafix.yaml`` exists and overwriting it was not asked for."""


@dataclass(frozen=True)
class RecipeGuess:
    """A recipe for a repository and how it came about."""

    project: str
    """What was recognised, e.g. ``npm project (package-lock.json)``."""
    recipe: AppRecipe
    guessed: list[str] = field(default_factory=list)
    """Each field that was guessed, with what it was guessed from."""
    check: list[str] = field(default_factory=list)
    """What the maintainer must check (at least the start command, the port and the readiness path; for a
    library, that it has no app)."""


def guess_recipe(repo_dir: Path) -> RecipeGuess:
    """The recipe for the project at the root of ``repo_dir``: Node when a ``package.json`` is there, else
    Python; :class:`NothingToGuessError` when neither is recognised, :class:`RecipeError` when a manifest
    cannot be read. Reads files only."""
    if (repo_dir / "package.json").is_file():
        guess = _guess_node(repo_dir)
        python = [n for n in ("pyproject.toml", "requirements.txt", "setup.py") if (repo_dir / n).is_file()]
        if python:
            guess.check.append(
                f"the repository also has {', '.join(python)}: this recipe builds the Node project; "
                "rewrite it if the application is the Python one"
            )
        return guess
    python_guess = _guess_python(repo_dir)
    if python_guess is None:
        raise NothingToGuessError(
            f"{repo_dir}: no package.json, pyproject.toml, setup.py, requirements*.txt or *.py at its root: "
            f"write {RECIPE_FILE} by hand (the fields are durafix's docs/environments.md)"
        )
    return python_guess


def render_recipe(guess: RecipeGuess) -> str:
    """The ``durafix.yaml`` text: a comment naming the project and what to check, then the recipe's fields
    (the empty ``fixtures``, ``env`` and ``secrets`` included, to show where they go). A recipe without ``start``
    (a library) is written without ``start``, ``port`` and ``readiness``: they mean nothing without an app."""
    app = ("start", "port", "readiness") if guess.recipe.start is not None else ()
    subset = ("test_subset",) if guess.recipe.test_subset is not None else ()
    fields = ("setup", *app, "test", *subset, "fixtures", "env", "secrets")
    data = guess.recipe.model_dump(mode="json", include=set(fields))
    ordered: dict[str, Any] = {key: data[key] for key in fields}
    after_setup: dict[str, Any] = {}
    if guess.recipe.setup_network:
        # Right after setup, where a reader looks for why an install can reach the registry.
        after_setup["setup_network"] = True
    if guess.recipe.setup_check:
        after_setup["setup_check"] = guess.recipe.setup_check
    ordered = {"setup": ordered.pop("setup"), **after_setup, **ordered}
    ordered["lock_files"] = guess.recipe.lock_files
    if guess.recipe.cache is not None:
        # Declared, so the dependency cache never has to guess the install directory (nor warn that it cannot).
        ordered["cache"] = guess.recipe.cache
    ordered["image"] = guess.recipe.image.model_dump(mode="json")
    does = "builds, starts, probes and tests" if guess.recipe.start is not None else "builds and tests"
    header = [
        f"# How durafix {does} this repository (durafix's docs/environments.md),",
        f"# written by `durafix init` for this {guess.project}.",
        "# Check before committing:",
        *(f"# - {line}" for line in guess.check),
    ]
    body = yaml.safe_dump(ordered, sort_keys=False, default_flow_style=False, width=1000, allow_unicode=True)
    return "\n".join(header) + "\n" + body


def write_recipe(repo_dir: Path, guess: RecipeGuess, *, force: bool = False) -> Path:
    """Write :func:`render_recipe` to ``repo_dir/durafix.yaml`` and return its path.

    The text is parsed back with :func:`~environments.spec.load_recipe` and its lock files hashed first, so
    what is written is a recipe every run accepts and that means exactly ``guess.recipe``. An existing file
    is :class:`RecipeExistsError` unless ``force``; without ``force`` the file appears whole or not at all
    and an existing one is never replaced, even by a concurrent writer.
    """
    text = render_recipe(guess)
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / RECIPE_FILE).write_text(text, encoding="utf-8")
        parsed = load_recipe(Path(scratch))
    if parsed != guess.recipe:
        raise RecipeError(f"the written recipe would read back differently: {parsed!r} != {guess.recipe!r}")
    dependency_lock_hash(repo_dir, parsed)
    target = repo_dir / RECIPE_FILE
    if target.exists() and not force:
        raise RecipeExistsError(f"{target} exists; --force overwrites it")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{RECIPE_FILE}.", dir=repo_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        tmp.chmod(0o644)
        if force:
            tmp.replace(target)
        else:
            try:
                os.link(tmp, target)  # fails if the file appeared meanwhile: never replaced without --force
            except FileExistsError:
                raise RecipeExistsError(f"{target} exists; --force overwrites it") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


# ---- Node -------------------------------------------------------------------------------------------------


def _guess_node(repo_dir: Path) -> RecipeGuess:
    path = repo_dir / "package.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RecipeError(f"{path}: cannot be read as JSON: {err}") from err
    if not isinstance(manifest, dict):
        raise RecipeError(f"{path}: not a JSON object")
    scripts_raw = manifest.get("scripts")
    scripts = {str(k): str(v) for k, v in scripts_raw.items()} if isinstance(scripts_raw, dict) else {}
    guessed: list[str] = []
    check: list[str] = []

    locks = [(name, manager) for name, manager in _NODE_LOCKS if (repo_dir / name).is_file()]
    declared = str(manifest.get("packageManager", "")).partition("@")[0]
    chosen = next(((n, m) for n, m in locks if m == declared), locks[0] if locks else None)
    cache: list[str] | None = [JS_INSTALL_DIR]
    if chosen is not None:
        lock, manager = chosen
        setup = [_NODE_INSTALL[manager]]
        lock_files = [lock]
        project = f"{manager} project ({lock})"
        if manager == "yarn" and _yarn_berry(repo_dir):
            # Yarn 2+ ("berry") refuses --frozen-lockfile's meaning under that name; --immutable is its own.
            setup = ["yarn install --immutable"]
            project = f"yarn 2+ project ({lock})"
            cache = _berry_cache(repo_dir, check)
        guessed.append(f"setup: {setup[0]} (from {lock})")
        if len(locks) > 1:
            check.append(f"several lock files ({', '.join(n for n, _ in locks)}): this recipe uses {lock}")
    else:
        manager = declared if declared in _NODE_INSTALL else "npm"
        setup = [f"{manager} install"]
        lock_files = []
        project = f"{manager} project (no lock file)"
        guessed.append(f"setup: {setup[0]} (no lock file found)")
        check.append("no lock file: every run resolves dependencies anew; commit one and use its frozen install")
    if cache:
        guessed.append(f"cache: {', '.join(cache)}: what setup creates, kept per lock hash")
    run = {"npm": "npm run", "yarn": "yarn run", "pnpm": "pnpm run"}[manager]

    test = f"{manager} test"
    test_script = scripts.get("test", "")
    if test_script and test_script != NPM_PLACEHOLDER_TEST:
        guessed.append(f"test: {test} (scripts.test: {test_script})")
    else:
        check.append(
            "test: package.json has no real scripts.test, so this test command fails and every run would stop "
            "at its baseline: set the command that runs the tests"
        )

    port = DEFAULT_NODE_PORT
    start: str | None = None
    if "start" in scripts or "dev" in scripts:
        script_name = "start" if "start" in scripts else "dev"
        script = scripts[script_name]
        start = f"{manager} start" if script_name == "start" else f"{run} dev"
        if re.search(r"(^|[\s/])vite(\s|$)", script) and not re.search(r"\bvite (build|preview)\b", script):
            # Vite's dev server ignores $PORT and moves to another port when its own is taken.
            start = f"{run} {script_name} -- --host 0.0.0.0 --port $PORT --strictPort"
            port = 5173
            guessed.append(f"start: {start} (scripts.{script_name} runs vite: {script})")
        else:
            guessed.append(f"start: {start} (scripts.{script_name}: {script})")
            found = _port_in(script)
            if found is not None:
                port = found
                guessed.append(f"port: {port} (written in scripts.{script_name})")
                check.append(
                    f"scripts.{script_name} fixes port {port}, but the local provider gives the app a free port "
                    "in $PORT: make the app listen on $PORT"
                )
            else:
                guessed.append(f"port: {port} (the usual default; scripts.{script_name} names none)")
    else:
        guessed.append("start: none (package.json has no scripts.start or scripts.dev: a library)")
    check.append(_start_check(start) if start is not None else _library_check())
    if isinstance(manifest.get("workspaces"), (list, dict)) or (repo_dir / "pnpm-workspace.yaml").is_file():
        check.append(
            "cache: in a workspace the install may also create node_modules inside the packages; if the "
            "environment log says `not cached: setup also changed <path>`, add those paths to `cache`"
        )

    if start is not None:
        check.extend(_app_checks(port, deadline_s=60))
    if manager != "npm":
        check.append(f"image: Debian has no {manager} package; the Docker provider needs it in the image")
    recipe = AppRecipe(
        setup=setup,
        # Installing from the registry needs the network, which setup has only when the recipe asks for it.
        setup_network=bool(setup),
        test=test,
        lock_files=lock_files,
        cache=cache,
        image=ImageRecipe(packages=["nodejs", "npm"]),
        **_app_fields(start, port, deadline_s=60),
    )
    return RecipeGuess(project, recipe, guessed, check)


def _yarn_berry(repo_dir: Path) -> bool:
    """Yarn 2 or later: its configuration file, or its lock file's ``__metadata`` (yarn 1 writes none)."""
    if (repo_dir / ".yarnrc.yml").is_file():
        return True
    head = _read_text(repo_dir / "yarn.lock")[:4096]
    return any(line.startswith("__metadata:") for line in head.splitlines())


def _berry_cache(repo_dir: Path, check: list[str]) -> list[str]:
    """What ``yarn install`` of yarn 2+ creates in the tree: ``node_modules`` and its install state with the
    node-modules linker; with Plug'n'Play (the default) files that depend on the packages (``.pnp.cjs``,
    ``.pnp.loader.mjs``, ``.yarn/unplugged``), so nothing is cached (``[]``) and the maintainer is told."""
    linker = re.search(r"^nodeLinker:\s*[\"']?([\w-]+)", _read_text(repo_dir / ".yarnrc.yml"), re.MULTILINE)
    if linker is not None and linker.group(1) in ("node-modules", "pnpm"):
        return [JS_INSTALL_DIR, ".yarn/install-state.gz"]
    check.append(
        "cache: [] because yarn Plug'n'Play writes files that depend on the packages (.pnp.cjs, .yarn/...): "
        "setup runs in every workspace; list what `yarn install` creates in `cache` to keep it per lock hash"
    )
    return []


def _start_check(start: str) -> str:
    if "$PORT" in start:
        return f"start: `{start}` is a guess: check that it serves the app"
    return f"start: `{start}` must serve the app on $PORT (the local provider sets it; Docker sets it to `port`)"


def _port_in(script: str) -> int | None:
    for pattern in _PORT_IN_SCRIPT:
        match = pattern.search(script)
        if match is not None and 0 < int(match.group(1)) < 65536:
            return int(match.group(1))
    return None


def _app_checks(port: int, *, deadline_s: int) -> list[str]:
    """What to check of an app's port and readiness probe."""
    return [
        f"port: {port} is the port inside a Docker environment",
        f"readiness: GET / must answer 200 within {deadline_s} s once started; point `readiness.path` at a health "
        "endpoint if the app has one",
    ]


def _app_fields(start: str | None, port: int, *, deadline_s: int) -> dict[str, Any]:
    """The recipe's ``start``, ``port`` and ``readiness`` for an app; none of them for a library (``start`` is
    ``None``): the recipe's defaults, which :func:`render_recipe` leaves out."""
    if start is None:
        return {}
    return {
        "start": start,
        "port": port,
        "readiness": ReadinessProbe(path="/", expected_status=200, deadline_s=deadline_s),
    }


# ---- Python -----------------------------------------------------------------------------------------------

# Requirements files are looked for this deep (the root is depth 0), outside hidden directories, virtual
# environments and these.
_MAX_REQUIREMENTS_DEPTH = 4
_SKIPPED_DIRS = frozenset({"node_modules", "site-packages", "__pycache__", "build", "dist"})
_REQUIREMENTS_DIRS = frozenset({"requirements", "requirements.d", "reqs"})
_TEST_WORDS = frozenset({"test", "tests", "testing"})
_DEV_WORDS = frozenset({"dev", "develop", "development"})
_MAIN_STEMS = frozenset({"requirements", "base", "main", "common", "prod", "production", "install", "runtime"})
# Extras and dependency groups the tests' requirements are looked for in, in order of preference.
_TEST_SETS = ("test", "tests", "testing", "dev")
_INCLUDE = re.compile(r"^\s*(?:-r|-c|--requirement|--constraint)(?:\s*=\s*|\s+)(\S+)")
# The first pip that installs PEP 735 dependency groups (`pip install --group NAME`).
PIP_WITH_GROUPS = "pip>=25.1"
VENV = ".venv"


@dataclass(frozen=True)
class _PythonTool:
    project: str
    setup: list[str]
    python: str
    """How to run the project's interpreter."""
    pytest: str
    lock_files: list[str]
    packages: list[str]
    cache: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _TestSets:
    """What of ``pyproject.toml`` holds the tests' requirements: one extra and one dependency group at most."""

    extra: str | None
    group: str | None

    def names(self, pyproject: dict[str, Any]) -> set[str]:
        """The requirement names the chosen extra and group declare (a group's ``include-group`` followed)."""
        names: set[str] = set()
        if self.extra is not None:
            names |= _names_in(pyproject.get("project", {}).get("optional-dependencies", {}).get(self.extra, []))
        if self.group is not None:
            names |= _group_names(pyproject, self.group, set())
        return names


def _guess_python(repo_dir: Path) -> RecipeGuess | None:
    pyproject = _read_pyproject(repo_dir)
    guessed: list[str] = []
    check: list[str] = []
    files = _requirement_files(repo_dir)
    main = _main_requirements(files)
    tests = [f for f in files if _requirements_kind(f) == "test"] or [
        f for f in files if _requirements_kind(f) == "dev"
    ]
    chosen = [*main, *tests]
    skipped = [f for f in files if f not in chosen]
    if skipped:
        guessed.append(f"left out {', '.join(skipped)} (neither the main nor a test requirements file)")
    pinned = _with_includes(repo_dir, chosen)
    sets = _test_sets(pyproject or {})
    pytest_reason = _pytest_reason(repo_dir, pyproject, pinned)

    tool: _PythonTool | None = None
    if (repo_dir / "uv.lock").is_file() and pyproject is not None:
        tool = _uv_tool(repo_dir, pyproject, sets)
        check.append("image: Debian has no uv package; the Docker provider needs it in the image")
    elif (repo_dir / "poetry.lock").is_file():
        tool = _poetry_tool(pyproject or {}, sets)
    elif chosen or pyproject is not None or (repo_dir / "setup.py").is_file():
        tool = _pip_tool(repo_dir, pyproject, main, tests, pinned, sets, pytest_reason, guessed, check)
    if tool is None and (pyproject is not None or any(repo_dir.glob("*.py"))):
        if pytest_reason is None:
            tool = _PythonTool(
                "Python project (no dependencies declared)", [], "python3", "python3 -m pytest", [], ["python3"]
            )
        else:
            # The tests are pytest's and the system's Python may not have it: a venv of their own, with pytest.
            tool = _PythonTool(
                "Python project (no dependencies declared)",
                [f"python3 -m venv {VENV} && {VENV}/bin/pip install pytest"],
                f"{VENV}/bin/python",
                f"{VENV}/bin/python -m pytest",
                [],
                ["python3", "python3-venv"],
                cache=[VENV],
            )
            check.append(
                "setup installs the newest pytest on every run (nothing pins it): pin it in a requirements file"
            )
    if tool is None:
        return None
    guessed.append(f"setup: {tool.setup[0]}" if tool.setup else "setup: none (no requirements declared)")
    if tool.cache:
        egg = " (setuptools writes the .egg-info next to the package)" if tool.cache[-1].endswith(".egg-info") else ""
        guessed.append(f"cache: {', '.join(tool.cache)}: what setup creates, kept per lock hash{egg}")

    setup_check: str | None = None
    module = _own_module(repo_dir, pyproject)
    if module is not None and any(" -e " in command for command in tool.setup):
        setup_check = f'{tool.python} -I -c "import {module}"'
        guessed.append(f"setup_check: {setup_check} (the editable install's package, {module})")

    test_subset: str | None = None
    if pytest_reason is not None:
        test = tool.pytest
        guessed.append(f"test: {test} ({pytest_reason})")
        # pytest takes files and test IDs alike: the regression proof and a `test` reproduction both run with it.
        test_subset = f"{tool.pytest} {{files}}"
        guessed.append(f"test_subset: {test_subset} (named tests: the regression proof, test reproductions)")
    else:
        test = f"{tool.python} -m unittest discover"
        guessed.append(f"test: {test} (no pytest configuration or dependency found)")
        check.append("test: unittest discovery finds tests in importable packages only (a tests/__init__.py)")

    app = _python_start(repo_dir, tool.python)
    start: str | None = None
    port = DEFAULT_PYTHON_PORT
    if app is None:
        guessed.append("start: none (no app found: a library)")
        check.append(_library_check())
    else:
        start, port, reason = app
        guessed.append(f"start: {start} ({reason})")
        guessed.append(f"port: {port} (its usual default)")
        check.append(_start_check(start))
        check.extend(_app_checks(port, deadline_s=30))
    recipe = AppRecipe(
        setup=tool.setup,
        setup_network=bool(tool.setup),
        setup_check=setup_check,
        **_app_fields(start, port, deadline_s=30),
        test=test,
        test_subset=test_subset,
        env=tool.env,
        lock_files=tool.lock_files,
        cache=tool.cache,
        image=ImageRecipe(packages=tool.packages),
    )
    return RecipeGuess(tool.project, recipe, guessed, check)


def _uv_tool(repo_dir: Path, pyproject: dict[str, Any], sets: _TestSets) -> _PythonTool:
    """``uv sync --frozen``: the project (when it is a package), its ``dev`` group (uv's default), and the tests'
    extra and other group when there are any."""
    flags = f" --extra {sets.extra}" if sets.extra else ""
    flags += f" --group {sets.group}" if sets.group and sets.group != "dev" else ""
    backend = str(pyproject.get("build-system", {}).get("build-backend", ""))
    built = _egg_info(repo_dir, pyproject) if backend.startswith("setuptools") else None
    return _PythonTool(
        "uv project (uv.lock)",
        [f"uv sync --frozen{flags}"],
        "uv run python",
        "uv run pytest",
        ["uv.lock"],
        ["python3"],
        cache=[VENV, *([built] if built else [])],
    )


def _poetry_tool(pyproject: dict[str, Any], sets: _TestSets) -> _PythonTool:
    """``poetry install`` into the project's own ``.venv`` (by default poetry keeps it in its cache directory,
    which the tests' sandbox does not see), with the tests' extra and optional group."""
    groups = pyproject.get("tool", {}).get("poetry", {}).get("group", {})
    optional = [
        name for name in _TEST_SETS if isinstance(groups.get(name), dict) and groups[name].get("optional") is True
    ][:1]
    flags = f" --extras {sets.extra}" if sets.extra else ""
    flags += f" --with {optional[0]}" if optional else ""
    return _PythonTool(
        "poetry project (poetry.lock)",
        [f"poetry install{flags}"],
        "poetry run python",
        "poetry run pytest",
        ["poetry.lock"],
        ["python3", "python3-poetry"],
        cache=[VENV],
        env={"POETRY_VIRTUALENVS_IN_PROJECT": "true"},
    )


def _pip_tool(
    repo_dir: Path,
    pyproject: dict[str, Any] | None,
    main: list[str],
    tests: list[str],
    pinned: list[str],
    sets: _TestSets,
    pytest_reason: str | None,
    guessed: list[str],
    check: list[str],
) -> _PythonTool | None:
    """A ``.venv`` with pip: the main and test requirements files, the project itself (editable, with its test
    extra) unless the main requirements file stands for it in a flat layout, the tests' dependency group, and
    pytest itself when the tests are pytest's and nothing else installs it; ``None`` when there is nothing to
    install."""
    installable = (repo_dir / "setup.py").is_file() or (
        pyproject is not None and ("project" in pyproject or "build-system" in pyproject)
    )
    editable = installable and (not main or sets.extra is not None or (repo_dir / "src").is_dir())
    # A main file a test file includes (`-r base.txt`) is installed through it.
    included = _with_includes(repo_dir, tests)
    targets = [f"-r {name}" for name in main if name not in included]
    if editable:
        targets.append(f"-e '.[{sets.extra}]'" if sets.extra else "-e .")
    targets += [f"-r {name}" for name in tests]
    installed = {name for path in pinned for name in _requirement_names(_read_text(repo_dir / path))}
    if editable and pyproject is not None:
        installed |= _names_in(pyproject.get("project", {}).get("dependencies", []))
    if sets.group is not None:
        targets.append(f"--group {sets.group}")
    installed |= sets.names(pyproject or {})
    if pytest_reason is not None and "pytest" not in installed:
        targets.append("pytest")
        guessed.append("pytest added to setup: the tests are pytest's and nothing else installs it")
        check.append("setup installs the newest pytest (nothing pins it): pin it with the test requirements")
    if not targets:
        return None
    commands = [f"python3 -m venv {VENV}"]
    if sets.group is not None:
        commands.append(f"{VENV}/bin/pip install --upgrade '{PIP_WITH_GROUPS}'")
    commands.append(f"{VENV}/bin/pip install {' '.join(targets)}")
    manifests = [name for name in ("pyproject.toml", "setup.py", "setup.cfg") if (repo_dir / name).is_file()]
    lock_files = [*(manifests if editable else []), *pinned]
    if not lock_files and manifests:
        lock_files = manifests[:1]  # what pip reads for `--group` or the pytest it adds: at least a key
    cache = [VENV]
    built = _egg_info(repo_dir, pyproject) if editable else None
    if built is not None:
        cache.append(built)
    if editable:
        check.append(
            "cache: a build backend that leaves other files in the tree makes the environment log say "
            "`not cached: setup also changed <path>`: add that path to `cache`"
        )
    if not pinned:
        check.append("no lock file: every run resolves dependencies anew; pin them (a lock or requirements file)")
    described = ", ".join(main + tests)
    if editable or not described:
        described = ", ".join([manifests[0], described] if described else [manifests[0], "no lock file"])
    return _PythonTool(
        f"pip project ({described})",
        [" && ".join(commands)],
        f"{VENV}/bin/python",
        f"{VENV}/bin/python -m pytest",
        lock_files,
        ["python3", "python3-venv"],
        cache=cache,
    )


def _library_check() -> str:
    return (
        "start: no app was found, so the recipe has no `start` (nor `port` and `readiness`): reproductions of this "
        "project's reports will be commands or tests run in the sandbox, not a browser on a running app. If the "
        "project has an app, add `start` (the command that serves it on $PORT) and `readiness`"
    )


def _requirement_files(repo_dir: Path) -> list[str]:
    """Every requirements file in the tree (``requirements*.txt``, ``*requirements*.txt``, any ``.txt`` in a
    ``requirements/`` directory), as paths from the root, sorted; links are left out (a run never reads a lock
    file through one)."""
    found: list[str] = []
    for current, dirs, names in os.walk(repo_dir):
        here = Path(current)
        rel = PurePosixPath(here.relative_to(repo_dir).as_posix())
        depth = 0 if str(rel) == "." else len(rel.parts)
        dirs[:] = sorted(
            d
            for d in dirs
            if depth < _MAX_REQUIREMENTS_DEPTH
            and not d.startswith(".")
            and d not in _SKIPPED_DIRS
            and not (here / d / "pyvenv.cfg").exists()
        )
        for name in names:
            in_dir = depth > 0 and rel.name.lower() in _REQUIREMENTS_DIRS
            named = name.endswith(".txt") and ("requirements" in name.lower() or in_dir)
            if named and not (here / name).is_symlink():
                found.append(str(rel / name) if depth else name)
    return sorted(found)


def _requirements_kind(path: str) -> str | None:
    """``test``, ``dev`` or ``main`` by the file's name (a ``requirements.txt`` by its directory's too), else
    ``None`` (docs, lint, ...)."""
    pure = PurePosixPath(path)
    stem = pure.stem.lower()
    words = set(re.split(r"[^a-z0-9]+", stem))
    if stem == "requirements" and len(pure.parts) > 1:
        words |= set(re.split(r"[^a-z0-9]+", pure.parent.name.lower()))
    if words & _TEST_WORDS:
        return "test"
    if words & _DEV_WORDS:
        return "dev"
    if path == "requirements.txt":
        return "main"
    if len(pure.parts) == 2 and pure.parent.name.lower() in _REQUIREMENTS_DIRS and stem in _MAIN_STEMS:
        return "main"
    return None


def _main_requirements(files: list[str]) -> list[str]:
    """The root ``requirements.txt``, else one main file of a ``requirements/`` directory (``base.txt``, ...)."""
    if "requirements.txt" in files:
        return ["requirements.txt"]
    return [f for f in files if _requirements_kind(f) == "main"][:1]


def _with_includes(repo_dir: Path, files: list[str]) -> list[str]:
    """``files`` and, after them, the files inside the repository they include (``-r``, ``-c``), recursively:
    what the install reads, so what the lock hash covers."""
    found = list(files)
    for path in found:  # grows while it is walked
        for line in _read_text(repo_dir / path).splitlines():
            match = _INCLUDE.match(line)
            if match is None or "://" in match.group(1) or "$" in match.group(1):
                continue
            target = os.path.normpath(str(PurePosixPath(path).parent / match.group(1)))
            if target.startswith("..") or os.path.isabs(target) or target in found:
                continue
            if (repo_dir / target).is_file() and not (repo_dir / target).is_symlink():
                found.append(target)
    return found


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _test_sets(pyproject: dict[str, Any]) -> _TestSets:
    """The extra and the dependency group with the tests' requirements: of those named test, tests, testing or
    dev, the first that requires pytest, else the first."""
    extras = pyproject.get("project", {}).get("optional-dependencies", {})
    groups = pyproject.get("dependency-groups", {})

    def pick(table: Any, names: Callable[[str], set[str]]) -> str | None:
        present = [name for name in _TEST_SETS if isinstance(table, dict) and name in table]
        with_pytest = [name for name in present if "pytest" in names(name)]
        return next(iter(with_pytest or present), None)

    extra = pick(extras, lambda name: _names_in(extras.get(name, [])))
    group = pick(groups, lambda name: _group_names(pyproject, name, set()))
    return _TestSets(extra, group)


def _names_in(entries: Any) -> set[str]:
    names: set[str] = set()
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, str):
            names |= _requirement_names(entry)
    return names


def _group_names(pyproject: dict[str, Any], group: str, seen: set[str]) -> set[str]:
    """The requirement names of a PEP 735 dependency group, its ``{include-group = ...}`` entries followed."""
    entries = pyproject.get("dependency-groups", {}).get(group, [])
    names = _names_in(entries)
    seen.add(group)
    for entry in entries if isinstance(entries, list) else []:
        included = entry.get("include-group") if isinstance(entry, dict) else None
        if isinstance(included, str) and included not in seen:
            names |= _group_names(pyproject, included, seen)
    return names


def _egg_info(repo_dir: Path, pyproject: dict[str, Any] | None) -> str | None:
    """The ``NAME.egg-info`` directory setuptools writes next to the project's packages when it builds the
    project (pip also builds with setuptools a project that names no build backend); ``None`` when another
    backend builds it or the name is unknown."""
    backend = (pyproject or {}).get("build-system", {}).get("build-backend")
    if backend is not None and not str(backend).startswith("setuptools"):
        return None
    name = (pyproject or {}).get("project", {}).get("name")
    setup_cfg = configparser.ConfigParser()
    with contextlib.suppress(configparser.Error, OSError, UnicodeDecodeError):
        setup_cfg.read(repo_dir / "setup.cfg", encoding="utf-8")
    if not isinstance(name, str):
        name = setup_cfg.get("metadata", "name", fallback=None)
    if not isinstance(name, str) or not name.strip():
        return None
    configured = (pyproject or {}).get("tool", {}).get("setuptools", {}).get("package-dir", {})
    base = configured.get("") if isinstance(configured, dict) else None
    if not isinstance(base, str):
        cfg = setup_cfg.get("options", "package_dir", fallback="").strip()
        base = cfg.partition("=")[2].strip() if cfg.startswith("=") else None
    if not isinstance(base, str):
        # setuptools' automatic discovery takes a src/ directory for the src-layout.
        base = "src" if (repo_dir / "src").is_dir() else ""
    egg = re.sub(r"[^A-Za-z0-9.]+", "_", name.strip()).strip("_") + ".egg-info"
    path = PurePosixPath(base.strip("/") or ".") / egg
    return str(path)


def _own_module(repo_dir: Path, pyproject: dict[str, Any] | None) -> str | None:
    """The import name of the project's own package, when its ``[project] name`` (normalized: lower case, ``-``
    and ``.`` as ``_``) is a package or module at the root or under ``src/``; else ``None`` (no guess)."""
    name = (pyproject or {}).get("project", {}).get("name")
    if not isinstance(name, str):
        return None
    module = re.sub(r"[-.]+", "_", name).lower()
    if not module.isidentifier():
        return None
    for base in (repo_dir, repo_dir / "src"):
        if (base / module / "__init__.py").is_file() or (base / f"{module}.py").is_file():
            return module
    return None


def _read_pyproject(repo_dir: Path) -> dict[str, Any] | None:
    path = repo_dir / "pyproject.toml"
    if not path.is_file():
        return None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise RecipeError(f"{path}: cannot be read as TOML: {err}") from err


def _pytest_reason(repo_dir: Path, pyproject: dict[str, Any] | None, requirement_files: list[str]) -> str | None:
    """Why the tests look like pytest's, or None."""
    if pyproject is not None and "pytest" in pyproject.get("tool", {}):
        return "[tool.pytest] in pyproject.toml"
    for name, section in (("pytest.ini", None), ("setup.cfg", "[tool:pytest]"), ("tox.ini", "[pytest]")):
        path = repo_dir / name
        if path.is_file() and (section is None or section in path.read_text(encoding="utf-8", errors="replace")):
            return f"configured in {name}"
    for conftest in ("conftest.py", "tests/conftest.py", "test/conftest.py"):
        if (repo_dir / conftest).is_file():
            return f"{conftest}"
    for name in requirement_files:
        if name.endswith(".txt") and "pytest" in _requirement_names((repo_dir / name).read_text(errors="replace")):
            return f"pytest in {name}"
    if pyproject is not None and "pytest" in _dependency_names(pyproject):
        return "pytest among pyproject.toml's dependencies"
    return None


def _requirement_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if match is not None:
            names.add(match.group(1).lower())
    return names


def _dependency_names(pyproject: dict[str, Any]) -> set[str]:
    """Names of every requirement pyproject.toml declares: PEP 621 dependencies and extras, PEP 735 groups,
    uv's dev-dependencies, poetry's dependency tables and groups."""
    project = pyproject.get("project", {})
    tool = pyproject.get("tool", {})
    poetry = tool.get("poetry", {})
    lists: list[Any] = [project.get("dependencies", []), tool.get("uv", {}).get("dev-dependencies", [])]
    lists += list(project.get("optional-dependencies", {}).values())
    lists += list(pyproject.get("dependency-groups", {}).values())
    tables: list[Any] = [poetry.get("dependencies", {}), poetry.get("dev-dependencies", {})]
    tables += [group.get("dependencies", {}) for group in poetry.get("group", {}).values() if isinstance(group, dict)]
    names: set[str] = set()
    for entries in lists:
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, str):  # include-group tables of PEP 735 name no package
                names |= _requirement_names(entry)
    for table in tables:
        if isinstance(table, dict):
            names |= {str(name).lower() for name in table}
    return names


def _python_start(repo_dir: Path, python: str) -> tuple[str, int, str] | None:
    """The start command, its port and where it was found; ``None`` when no app was (a library)."""
    if (repo_dir / "manage.py").is_file():
        return f"{python} manage.py runserver 0.0.0.0:$PORT --noreload", 8000, "manage.py: a Django project"
    for rel in _PYTHON_ENTRY_FILES:
        path = repo_dir / rel
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        module = rel.removesuffix(".py").replace("/", ".")
        fastapi = re.search(r"^(\w+)\s*=\s*FastAPI\(", source, re.MULTILINE)
        if fastapi is not None:
            target = f"{module}:{fastapi.group(1)}"
            return f"{python} -m uvicorn {target} --host 0.0.0.0 --port $PORT", 8000, f"a FastAPI app in {rel}"
        flask = re.search(r"^(\w+)\s*=\s*Flask\(", source, re.MULTILINE)
        if flask is not None:
            target = f"{module}:{flask.group(1)}"
            return f"{python} -m flask --app {target} run --host 0.0.0.0 --port $PORT", 5000, f"a Flask app in {rel}"
        if re.search(r"""^if __name__ == ['"]__main__['"]""", source, re.MULTILINE):
            # A script that takes --host/--port (argparse, click) is told where to listen.
            options = "".join(
                f" {option} {value}"
                for option, value in (("--host", "0.0.0.0"), ("--port", "$PORT"))
                if re.search(rf"""['"]{option}['"]""", source)
            )
            return f"{python} {rel}{options}", DEFAULT_PYTHON_PORT, f"{rel} runs as a script"
    return None
