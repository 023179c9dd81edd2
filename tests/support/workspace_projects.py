"""Projects whose setup installs the repository's own code into what the dependency cache keeps, so a restored
tree that still pointed at the workspace that built it would import that workspace's code: a pip project that
installs itself editable, and npm and pnpm projects that link a package of the checkout (``lib/``) into
``node_modules`` beside a registry package with a ``.bin`` entry (``semver``).

Each test command prints the ``mark.txt`` its code finds next to itself (the test writes a different one into
each workspace, untracked), so the output names the workspace whose source ran.

The lock files are made on the host by the package managers themselves (``npm install --package-lock-only``,
``pnpm install --lockfile-only``), against the real registry. pnpm is not a Debian package: :func:`pnpm_prefix`
installs a pinned version with npm into a directory of the user's cache, once per machine.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from environments.files import locked
from tests.support.gitrepo import Repo, make_repo
from tests.support.projects import write_project

PNPM_VERSION = "10.34.9"
SEMVER = "7.6.3"
# Setup runs sandboxed and may write only its workspace and the repository's package caches: the count of setups
# that ran is kept in the package cache directory, named by the variable.
COUNTER_VAR = "SETUP_COUNTER"

_PIP_PACKAGE = """import pathlib

MARK = (pathlib.Path(__file__).parent.parent / "mark.txt").read_text().strip()


def main() -> None:
    print("cli", MARK, __file__)
"""
_PIP_PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "durapkg"
version = "0.1.0"

[project.scripts]
durapkg-cli = "durapkg:main"

[tool.setuptools]
packages = ["durapkg"]
"""
# The editable finder (flat layout) maps durapkg to the source folder; the console script's shebang names the
# venv's python; six comes from PyPI into the same venv.
PIP_TEST = (
    ".venv/bin/python -I -c \"import durapkg, six; print('mark', durapkg.MARK, durapkg.__file__)\" "
    "&& .venv/bin/durapkg-cli"
)

_LIB_INDEX = """const fs = require("fs");
const path = require("path");
exports.mark = fs.readFileSync(path.join(__dirname, "..", "mark.txt"), "utf8").trim();
"""
_LIB_CLI = """#!/usr/bin/env node
console.log("cli", require("./index.js").mark, __filename);
"""
_NODE_TEST = """const semver = require("semver");
const lib = require("local-lib");
if (!semver.valid("1.2.3")) throw new Error("semver does not work");
console.log("mark", lib.mark, require.resolve("local-lib"), require.resolve("semver"));
"""
NODE_TEST = "node_modules/.bin/semver 1.2.3 && node_modules/.bin/local-lib && node test.js"
_NODE_APP = """require("http").createServer((req, res) => {
  res.statusCode = req.url === "/healthz" ? 200 : 404;
  res.end(require("local-lib").mark + "\\n");
}).listen(Number(process.env.PORT), "127.0.0.1");
"""


def pnpm_prefix() -> Path:
    """A directory holding ``node_modules/.bin/pnpm`` (:data:`PNPM_VERSION`), installed by npm under the user's
    cache the first time (under a lock, so concurrent tests install it once). A sandbox runs it only with this
    directory among its read-only paths."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "durafix" / f"pnpm-{PNPM_VERSION}"
    binary = root / "node_modules" / ".bin" / "pnpm"
    root.mkdir(parents=True, exist_ok=True)
    with locked(root.with_name(root.name + ".lock")):
        if not binary.exists():
            subprocess.run(
                ["npm", "install", "--prefix", str(root), "--no-audit", "--no-fund", f"pnpm@{PNPM_VERSION}"],
                check=True,
                capture_output=True,
                timeout=600,
            )
    return root


def pip_editable_project(tmp: Path, counter: Path) -> Repo:
    """A package (``durapkg``) that setup installs into ``.venv`` editable, beside ``six``; caches ``.venv`` and
    ``durapkg.egg-info``. Each setup appends a line to ``counter``."""
    source = write_project(
        tmp / "pip-editable-source",
        {
            "pyproject.toml": _PIP_PYPROJECT,
            "requirements.txt": "six==1.16.0\n",
            "durapkg/__init__.py": _PIP_PACKAGE,
            ".gitignore": ".venv/\n*.egg-info/\nmark.txt\n__pycache__/\n",
        },
        {
            "setup": [
                "python3 -m venv .venv",
                ".venv/bin/pip install --quiet -r requirements.txt -e .",
                f'echo pip >> "${COUNTER_VAR}"',
            ],
            "setup_check": ".venv/bin/python -I -c 'import durapkg'",
            "start": "sleep 300",
            "test": PIP_TEST,
            "env": {COUNTER_VAR: str(counter)},
            "setup_network": True,
            "cache": [".venv", "durapkg.egg-info"],
        },
    )
    return make_repo(tmp / "pip-editable", source)


def _node_source(tmp: Path, name: str, local: str) -> tuple[Path, dict[str, str]]:
    files = {
        "package.json": json.dumps(
            {
                "name": f"durafix-{name}-fixture",
                "version": "1.0.0",
                "private": True,
                "dependencies": {"semver": SEMVER, "local-lib": local},
            },
            indent=2,
        )
        + "\n",
        "lib/package.json": json.dumps(
            {"name": "local-lib", "version": "1.0.0", "main": "index.js", "bin": {"local-lib": "cli.js"}}, indent=2
        )
        + "\n",
        "lib/index.js": _LIB_INDEX,
        "lib/cli.js": _LIB_CLI,
        "test.js": _NODE_TEST,
        "app.js": _NODE_APP,
        ".gitignore": "node_modules/\nmark.txt\n",
    }
    return tmp / f"{name}-source", files


def npm_bin_project(tmp: Path, counter: Path) -> Repo:
    """``npm ci`` of ``semver`` and of ``lib/`` (``file:``, a link), with their ``node_modules/.bin`` links."""
    root, files = _node_source(tmp, "npm", "file:./lib")
    recipe = _node_recipe("npm ci --no-audit --no-fund", {COUNTER_VAR: str(counter)})
    source = write_project(root, files, recipe)
    (source / "lib" / "cli.js").chmod(0o755)
    _lock(source, ["npm", "install", "--package-lock-only", "--no-audit", "--no-fund", "--ignore-scripts"])
    return make_repo(tmp / "npm-bin", source)


def pnpm_project(tmp: Path, counter: Path) -> Repo:
    """``pnpm install --frozen-lockfile`` of ``semver`` and of ``lib/`` (``link:``), pnpm from :func:`pnpm_prefix`
    on the recipe's ``PATH``."""
    bin_dir = pnpm_prefix() / "node_modules" / ".bin"
    root, files = _node_source(tmp, "pnpm", "link:./lib")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", COUNTER_VAR: str(counter)}
    recipe = _node_recipe("pnpm install --frozen-lockfile", env)
    source = write_project(root, files, recipe)
    (source / "lib" / "cli.js").chmod(0o755)
    _lock(source, [str(bin_dir / "pnpm"), "install", "--lockfile-only"], store=True)
    return make_repo(tmp / "pnpm", source)


def _node_recipe(install: str, env: dict[str, str]) -> dict[str, object]:
    return {
        "setup": [install, f'echo node >> "${COUNTER_VAR}"'],
        "setup_check": "node -e 'require(\"local-lib\")'",
        "start": "node app.js",
        "readiness": {"path": "/healthz", "expected_status": 200, "deadline_s": 30},
        "test": NODE_TEST,
        "env": env,
        "setup_network": True,
    }


def _lock(source: Path, argv: list[str], *, store: bool = False) -> None:
    """Write the project's lock file with its package manager, on the host, with throwaway caches."""
    scratch = source.parent / f"{source.name}-lock-caches"
    env = {**os.environ, "npm_config_cache": str(scratch / "npm")}
    if store:
        env["npm_config_store_dir"] = str(scratch / "pnpm-store")
    subprocess.run(argv, cwd=source, env=env, check=True, capture_output=True, timeout=300)
