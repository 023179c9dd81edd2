"""A starter ``durafix.yaml`` guessed from what a repository holds (``durafix init``).

Recognised: Node projects (``package.json``, with ``package-lock.json`` / ``npm-shrinkwrap.json``,
``yarn.lock`` or ``pnpm-lock.yaml``) and Python projects (``uv.lock``, ``poetry.lock``, ``requirements*.txt``,
a bare ``pyproject.toml`` / ``setup.py``, or just ``*.py`` files). :func:`guess_recipe` reads files only (it
runs nothing) and says, next to the recipe, what it guessed from what and what a maintainer has to check;
:func:`write_recipe` validates the text with :func:`environments.spec.load_recipe`, the parser every run
uses, before writing it.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from environments.interface import AppRecipe, ImageRecipe, ReadinessProbe
from environments.spec import RECIPE_FILE, RecipeError, dependency_lock_hash, load_recipe

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
    """What the maintainer must check (at least the start command, the port and the readiness path)."""


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
    (the empty ``fixtures``, ``env`` and ``secrets`` included, to show where they go)."""
    data = guess.recipe.model_dump(
        mode="json", include={"setup", "start", "port", "readiness", "test", "fixtures", "env", "secrets"}
    )
    ordered: dict[str, Any] = {
        key: data[key] for key in ("setup", "start", "port", "readiness", "test", "fixtures", "env", "secrets")
    }
    after_setup: dict[str, Any] = {}
    if guess.recipe.setup_network:
        # Right after setup, where a reader looks for why an install can reach the registry.
        after_setup["setup_network"] = True
    if guess.recipe.setup_check:
        after_setup["setup_check"] = guess.recipe.setup_check
    ordered = {"setup": ordered.pop("setup"), **after_setup, **ordered}
    ordered["lock_files"] = guess.recipe.lock_files
    ordered["image"] = guess.recipe.image.model_dump(mode="json")
    header = [
        "# How durafix builds, starts, probes and tests this repository (durafix's docs/environments.md),",
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
    if chosen is not None:
        lock, manager = chosen
        setup = [_NODE_INSTALL[manager]]
        lock_files = [lock]
        project = f"{manager} project ({lock})"
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
        start = _placeholder_start()
        check.append("start: package.json has no scripts.start or scripts.dev: set the command that serves the app")

    check.extend(
        [
            _start_check(start),
            f"port: {port} is the port inside a Docker environment",
            "readiness: GET / must answer 200 within 60 s once started; point `readiness.path` at a health "
            "endpoint if the app has one",
        ]
    )
    packages = ["nodejs", "npm"]
    if manager != "npm":
        check.append(f"image: Debian has no {manager} package; the Docker provider needs it in the image")
    recipe = AppRecipe(
        setup=setup,
        # Installing from the registry needs the network, which setup has only when the recipe asks for it.
        setup_network=bool(setup),
        start=start,
        port=port,
        readiness=ReadinessProbe(path="/", expected_status=200, deadline_s=60),
        test=test,
        lock_files=lock_files,
        image=ImageRecipe(packages=packages),
    )
    return RecipeGuess(project, recipe, guessed, check)


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


def _placeholder_start() -> str:
    # A start command that says what is missing in the app's log, where a failed readiness wait points.
    return "echo 'durafix.yaml: set start to the command that serves the app on $PORT' >&2; exit 1"


# ---- Python -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _PythonTool:
    project: str
    setup: list[str]
    python: str
    """How to run the project's interpreter."""
    pytest: str
    lock_files: list[str]
    packages: list[str]


def _guess_python(repo_dir: Path) -> RecipeGuess | None:
    pyproject = _read_pyproject(repo_dir)
    setup_check: str | None = None
    guessed: list[str] = []
    check: list[str] = []
    requirements = sorted(p.name for p in repo_dir.glob("requirements*.txt") if p.is_file())
    tool: _PythonTool | None = None
    if (repo_dir / "uv.lock").is_file() and pyproject is not None:
        tool = _PythonTool(
            "uv project (uv.lock)", ["uv sync --frozen"], "uv run python", "uv run pytest", ["uv.lock"], ["python3"]
        )
        check.append("image: Debian has no uv package; the Docker provider needs it in the image")
    elif (repo_dir / "poetry.lock").is_file():
        tool = _PythonTool(
            "poetry project (poetry.lock)",
            ["poetry install"],
            "poetry run python",
            "poetry run pytest",
            ["poetry.lock"],
            ["python3", "python3-poetry"],
        )
    elif requirements:
        chosen = [n for n in requirements if n == "requirements.txt" or re.search(r"dev|test", n)] or requirements
        chosen.sort(key=lambda n: (n != "requirements.txt", n))
        install = " ".join(f"-r {n}" for n in chosen)
        tool = _PythonTool(
            f"pip project ({', '.join(chosen)})",
            [f"python3 -m venv .venv && .venv/bin/pip install {install}"],
            ".venv/bin/python",
            ".venv/bin/python -m pytest",
            chosen,
            ["python3", "python3-venv"],
        )
        skipped = [n for n in requirements if n not in chosen]
        if skipped:
            guessed.append(f"left out {', '.join(skipped)} (neither the main nor a dev/test requirements file)")
    elif pyproject is not None or (repo_dir / "setup.py").is_file():
        manifest = "pyproject.toml" if pyproject is not None else "setup.py"
        extras = _test_extras(pyproject or {})
        target = f"'.[{','.join(extras)}]'" if extras else "."
        tool = _PythonTool(
            f"pip project ({manifest}, no lock file)",
            [f"python3 -m venv .venv && .venv/bin/pip install -e {target}"],
            ".venv/bin/python",
            ".venv/bin/python -m pytest",
            [manifest],
            ["python3", "python3-venv"],
        )
        check.append("no lock file: every run resolves dependencies anew; pin them (a lock or requirements file)")
        module = _own_module(repo_dir, pyproject)
        if module is not None:
            setup_check = f'.venv/bin/python -I -c "import {module}"'
            guessed.append(f"setup_check: {setup_check} (the editable install's package, {module})")
    elif any(repo_dir.glob("*.py")):
        tool = _PythonTool(
            "Python project (no dependencies declared)", [], "python3", "python3 -m pytest", [], ["python3"]
        )
    if tool is None:
        return None
    guessed.append(f"setup: {tool.setup[0]}" if tool.setup else "setup: none (no requirements declared)")

    pytest_reason = _pytest_reason(repo_dir, pyproject, tool.lock_files)
    if pytest_reason is not None:
        test = tool.pytest
        guessed.append(f"test: {test} ({pytest_reason})")
    else:
        test = f"{tool.python} -m unittest discover"
        guessed.append(f"test: {test} (no pytest configuration or dependency found)")
        check.append("test: unittest discovery finds tests in importable packages only (a tests/__init__.py)")

    start, port, reason = _python_start(repo_dir, tool.python)
    if reason is None:
        check.append("start: no application entry point found: set the command that serves the app")
    else:
        guessed.append(f"start: {start} ({reason})")
        guessed.append(f"port: {port} (its usual default)")
    check.extend(
        [
            _start_check(start),
            f"port: {port} is the port inside a Docker environment",
            "readiness: GET / must answer 200 within 30 s once started; point `readiness.path` at a health "
            "endpoint if the app has one",
        ]
    )
    recipe = AppRecipe(
        setup=tool.setup,
        setup_network=bool(tool.setup),
        setup_check=setup_check,
        start=start,
        port=port,
        readiness=ReadinessProbe(path="/", expected_status=200, deadline_s=30),
        test=test,
        lock_files=tool.lock_files,
        image=ImageRecipe(packages=tool.packages),
    )
    return RecipeGuess(tool.project, recipe, guessed, check)


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


def _test_extras(pyproject: dict[str, Any]) -> list[str]:
    extras = pyproject.get("project", {}).get("optional-dependencies", {})
    return [name for name in ("test", "tests", "dev") if isinstance(extras, dict) and name in extras][:1]


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


def _python_start(repo_dir: Path, python: str) -> tuple[str, int, str | None]:
    """The start command, its port and where it was found (None: nothing was, the command is a placeholder)."""
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
    return _placeholder_start(), DEFAULT_PYTHON_PORT, None
