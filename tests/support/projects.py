"""Small projects with dependencies, committed into bare repositories for the dependency cache tests and benchmark.

:func:`npm_project` and :func:`pip_project` install one real package from the registry through the package
manager's own client (``npm ci``, ``pip install -r``); :func:`shell_project` fakes an install with shell
commands, for the tests that need no network. Each recipe's setup ends by appending a line to ``counter``, a file
outside the workspace, so a test can tell how many times setup really ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.support.gitrepo import Repo, make_repo, write_files

IS_NUMBER_LOCK = {
    "name": "durafix-npm-fixture",
    "version": "1.0.0",
    "lockfileVersion": 3,
    "requires": True,
    "packages": {
        "": {"name": "durafix-npm-fixture", "version": "1.0.0", "dependencies": {"is-number": "7.0.0"}},
        "node_modules/is-number": {
            "version": "7.0.0",
            "resolved": "https://registry.npmjs.org/is-number/-/is-number-7.0.0.tgz",
            "integrity": "sha512-41Cifkg6e8TylSpdtTpeLVMqvSBEVzTttHvERD741+pnZ8ANv0004MRL43QKPDlK9cGvNp6NZWZUBlbGXYx"
            "xng==",
            "license": "MIT",
            "engines": {"node": ">=0.12.0"},
        },
    },
}

NODE_APP = """const http = require("http");
const isNumber = require("is-number");
http.createServer((req, res) => {
  res.writeHead(req.url === "/healthz" && isNumber("42") ? 200 : 404);
  res.end("ok\\n");
}).listen(Number(process.env.PORT), "127.0.0.1");
"""
NODE_TEST = """const assert = require("assert");
const isNumber = require("is-number");
assert.strictEqual(isNumber("5"), true);
assert.strictEqual(isNumber("five"), false);
console.log("is-number tests passed");
"""
PYTHON_APP = """import os
import six
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" and six.PY3 else 404)
        self.end_headers()
        self.wfile.write(b"ok\\n")


HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""
# The restored venv must be the workspace's own: its pip (a script whose shebang names the venv's python) runs and
# reports the venv under the current directory.
PYTHON_TEST = (
    ".venv/bin/python -c \"import six; assert six.PY3; print('six', six.__version__)\" "
    '&& .venv/bin/pip --version | grep -F "$(pwd -P)/.venv/"'
)


def counter_lines(counter: Path) -> int:
    """How many times setup ran (the lines its last command appended)."""
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def write_project(root: Path, files: dict[str, str], recipe: dict[str, object]) -> Path:
    root.mkdir(parents=True)
    write_files(root, files)
    (root / "durafix.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root


def is_number_package(name: str, **fields: object) -> dict[str, str]:
    """The files of an npm package ``name`` whose one dependency is ``is-number`` 7.0.0: its ``package.json``
    (``fields``, e.g. scripts, after its name, version and private flag), the lock ``npm ci`` installs from
    (:data:`IS_NUMBER_LOCK` under this name: npm ci checks that they agree), and a ``.gitignore`` for
    ``node_modules``."""
    package = {"name": name, "version": "1.0.0", "private": True, **fields, "dependencies": {"is-number": "7.0.0"}}
    lock = json.loads(json.dumps(IS_NUMBER_LOCK).replace('"durafix-npm-fixture"', json.dumps(name)))
    return {
        "package.json": json.dumps(package, indent=2) + "\n",
        "package-lock.json": json.dumps(lock, indent=2) + "\n",
        ".gitignore": "node_modules/\n",
    }


def npm_project(tmp: Path, counter: Path | None, *, extra_setup: list[str] | None = None) -> Repo:
    """A node app needing ``is-number`` (package.json + package-lock.json), set up with ``npm ci``. Each setup
    appends a line to ``counter`` (a file setup can write: under the repository's package cache), unless it is
    None."""
    count = ['echo npm >> "$SETUP_COUNTER"'] if counter is not None else []
    source = write_project(
        tmp / "npm-source",
        {
            **is_number_package("durafix-npm-fixture"),
            "app.js": NODE_APP,
            "test.js": NODE_TEST,
        },
        {
            "setup": ["npm ci --no-audit --no-fund", *(extra_setup or []), *count],
            "start": "node app.js",
            "readiness": {"path": "/healthz", "expected_status": 200, "deadline_s": 30},
            "test": "node test.js",
            "env": {"SETUP_COUNTER": str(counter)} if counter is not None else {},
            "setup_network": True,
        },
    )
    return make_repo(tmp / "npm", source)


def pip_project(tmp: Path, counter: Path) -> Repo:
    """A Python app needing ``six`` (requirements.txt), set up in a ``.venv`` with pip."""
    source = write_project(
        tmp / "pip-source",
        {"requirements.txt": "six==1.16.0\n", "app.py": PYTHON_APP, ".gitignore": ".venv/\n"},
        {
            "setup": [
                "python3 -m venv .venv",
                ".venv/bin/pip install --quiet -r requirements.txt",
                'echo pip >> "$SETUP_COUNTER"',
            ],
            "start": ".venv/bin/python app.py",
            "readiness": {"path": "/healthz", "expected_status": 200, "deadline_s": 30},
            "test": PYTHON_TEST,
            "env": {"SETUP_COUNTER": str(counter)},
            "setup_network": True,
        },
    )
    return make_repo(tmp / "pip", source)


# A fake install: what npm ci would leave, plus a file naming the workspace (as build tools write) and a symlink
# into it, which a restore must make name the new workspace.
SHELL_SETUP = [
    "mkdir -p node_modules/dep/bin node_modules/.bin",
    "cp package-lock.json node_modules/dep/lock-copy || echo none > node_modules/dep/lock-copy",
    'printf "#!/bin/sh\\n# built in %s\\necho dep\\n" "$(pwd -P)" > node_modules/dep/bin/dep',
    "chmod +x node_modules/dep/bin/dep",
    'ln -s "$(pwd -P)/node_modules/dep/bin/dep" node_modules/.bin/dep',
    'echo shell >> "$SETUP_COUNTER"',
]


def shell_project(tmp: Path, counter: Path, *, lock: bool = True, **recipe: object) -> Repo:
    """A project whose 'install' is :data:`SHELL_SETUP` (no network), keyed by a package-lock.json (unless not
    ``lock``: then ``cp`` finds nothing to copy, and nothing is keyed)."""
    files = {"README.md": "docs\n", ".gitignore": "node_modules/\n"}
    if lock:
        files["package-lock.json"] = '{"lockfileVersion": 3, "packages": {}}\n'
    source = write_project(
        tmp / "shell-source",
        files,
        {
            "setup": SHELL_SETUP,
            "start": "sleep 300",
            "test": "test -x node_modules/.bin/dep",
            "env": {"SETUP_COUNTER": str(counter)},
            **recipe,
        },
    )
    return make_repo(tmp / "shell", source)
