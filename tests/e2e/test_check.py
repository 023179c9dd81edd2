"""``durafix check`` run as a maintainer runs it, on checkouts of real projects: the sample app with its report
reproduced in Chromium, a pip and an npm library installed from the registries with a command and a test report,
and broken recipes, each failure naming its fix. After every check nothing it started is running and nothing
but its kept logs is left in its temporary directory.

Each check runs the console script with ``TMPDIR`` pointing into the test's own directory, so what it leaves
there is exactly what it left; its commands carry a token of the test's in their text, so a process of theirs
still running is found in ``/proc`` whoever its parent is now.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from repair.procedure_draft import SUBMIT, TASK_MARKER
from tests.support.cart_reproductions import CART_API_TOTAL, reported
from tests.support.chromium import chromium_path
from tests.support.durafix_cli import DURAFIX, durafix
from tests.support.gitrepo import commit_files, git
from tests.support.modelserver import Serve, recorded, serve, tool_turn
from tests.support.projects import is_number_package
from tests.support.sandbox import require_bubblewrap

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cart"


def checkout(root: Path, files: dict[str, str], recipe: Mapping[str, object] | None) -> Path:
    """A git checkout at ``root`` with ``files`` (and ``durafix.yaml`` from ``recipe``) committed."""
    root.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=root)
    recipe_file = {} if recipe is None else {"durafix.yaml": yaml.safe_dump(dict(recipe), sort_keys=False)}
    commit_files(root, {**files, **recipe_file}, "project")
    return root


__all__ = ["serve"]


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """The test's directory, with ``tmpdir`` in it for the check's temporary files: under /tmp and traversable by
    anyone, since Chromium's home (made there) is used by the unprivileged user Chromium runs as when the test
    runs as root, which pytest's own directory (mode 0700) would shut out."""
    root = Path(tempfile.mkdtemp(prefix="durafix-check-test-"))
    root.chmod(0o711)
    (root / "tmpdir").mkdir(mode=0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def check_env(tmp: Path) -> dict[str, str]:
    """The check's environment: its state under ``tmp/state``, its temporary files under ``tmp/tmpdir``."""
    # No model unless a test gives one: a report without a block is then drafted by it.
    inherited = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "DURAFIX_MODEL", "OPENAI_BASE_URL")}
    return {**inherited, "DURAFIX_STATE_DIR": str(tmp / "state"), "TMPDIR": str(tmp / "tmpdir")}


def durafix_check(
    tmp: Path, directory: Path, *args: str, timeout_s: float = 600, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``durafix check DIRECTORY ARGS...`` in the environment of :func:`check_env` (and ``extra_env``)."""
    return durafix(["check", str(directory), *args], {**check_env(tmp), **(extra_env or {})}, timeout_s)


def passing_check(tmp: Path, repo: Path, report: str) -> str:
    """The output of ``durafix check REPO --report REPO/REPORT``, which must pass. The kept logs of a check before
    it are removed first, so that :func:`assert_nothing_left` speaks of this check alone."""
    for leftover in (tmp / "tmpdir").iterdir():
        subprocess.run(["rm", "-rf", str(leftover)], check=True)
    done = durafix_check(tmp, repo, "--report", str(repo / report))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def running_with(token: str) -> list[str]:
    """The command lines of live processes that mention ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if token in argv:
            found.append(argv)
    return found


def assert_nothing_left(tmp: Path, token: str = "") -> Path:
    """Nothing of the check runs, and its temporary directory holds only the kept logs; returns their path."""
    if token:
        deadline = time.monotonic() + 10
        while running_with(token) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running_with(token) == []
    left = sorted(p.name for p in (tmp / "tmpdir").iterdir())
    assert len(left) == 1 and left[0].startswith("durafix-check-") and "work" not in left[0], left
    return tmp / "tmpdir" / left[0]


@pytest.mark.browser
def test_the_sample_app_and_its_report_reproduce_in_chromium(tmp_path: Path) -> None:
    require_bubblewrap()
    chromium_path()
    files = {str(p.relative_to(EXAMPLE)): p.read_text() for p in EXAMPLE.rglob("*") if p.is_file()}
    repo = checkout(tmp_path / "cart", {name: text for name, text in files.items() if "__pycache__" not in name}, None)
    out = passing_check(tmp_path, repo, "ISSUE.md")
    head = git("rev-parse", "HEAD", cwd=repo)
    assert f"commit: {head}" in out
    assert "<== start: ok" in out and "sandbox: bubblewrap" in out
    assert "<== report: ok" in out and "reproduces: bug present in 2 of 2 runs" in out
    assert "<== tests: ok" in out
    assert out.index("==> recipe") < out.index("==> setup") < out.index("==> start") < out.index("==> tests")
    logs = assert_nothing_left(tmp_path)
    assert (logs / "environment.log").is_file() and list((logs / "browser").iterdir())
    assert git("status", "--porcelain", cwd=repo) == ""


def test_a_report_without_a_block_has_drafts_run_until_one_reproduces_with_a_model(
    tmp_path: Path, serve: Serve
) -> None:
    """A prose report and a configured model: the model drafts a command reproduction, the first draft (which
    reads a value the bug does not touch) runs in the sandbox and is sent back with what it found, and the second,
    which shows the bug, is the one the check reports, kept in the logs to paste into the report."""
    require_bubblewrap()
    first = (
        "version: 1\nkind: command\nname: one word\nsteps:\n  - run: python3 -c 'import lib; print(lib.words(\"a\"))'\n"
        'bug_present:\n  - {check: stdout, not_equals: "1"}\n'
    )
    second = first.replace("one word", "two words").replace('\\"a\\"', '\\"a b\\"').replace('"1"', '"2"')
    server = serve(
        {
            "model": "durafix-scripted",
            "conversations": [
                {
                    "name": "draft",
                    "match": {"system": re.escape(TASK_MARKER), "user": "(?i)words miscounts"},
                    "turns": [tool_turn(SUBMIT, yaml=first), tool_turn(SUBMIT, yaml=second)],
                }
            ],
        }
    )
    repo = checkout(
        tmp_path / "lib",
        {"lib.py": "def words(text):\n    return len(text.split(' ')) if ' ' not in text else 1\n"},
        {"test": "python3 -c 'import lib'"},
    )
    report = tmp_path / "ISSUE.md"
    report.write_text("# words miscounts two words\n\n`lib.words('a b')` answers 1; it should be 2.\n")
    env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test", "DURAFIX_MODEL": "durafix-scripted"}
    done = durafix_check(tmp_path, repo, "--report", str(report), extra_env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "the report has no reproduction: the model will draft one" in out, out
    assert "draft 1: the command `python3 -c 'import lib; print(lib.words(\"a\"))'`" in out, out
    assert "<== report: ok" in out and "drafted from the report (draft 2)" in out, out
    requests = [r for r in recorded(server) if "draft" in json.dumps(r)]
    assert len(requests) == 2
    assert "ran on the base revision" in json.dumps(requests[1]) and "not_reproduced" in json.dumps(requests[1])
    logs = assert_nothing_left(tmp_path)
    assert (logs / "drafts" / "draft-2.yaml").read_text() == second


APP_COMMAND_REPORT = reported(CART_API_TOTAL, "The cart API's total ignores quantities.\n")


def test_a_command_report_against_the_app_runs_while_the_sample_app_is_up(tmp_path: Path) -> None:
    """``app: true``: the app starts as for a browser procedure, the report's command reads its API from the app's
    network namespace, and the app is stopped afterwards."""
    require_bubblewrap()
    files = {str(p.relative_to(EXAMPLE)): p.read_text() for p in EXAMPLE.rglob("*") if p.is_file()}
    files = {name: text for name, text in files.items() if "__pycache__" not in name}
    repo = checkout(tmp_path / "cart", {**files, "API_ISSUE.md": APP_COMMAND_REPORT}, None)
    done = durafix_check(tmp_path, repo, "--report", str(repo / "API_ISSUE.md"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "<== start: ok" in out and "against the app" in out
    assert "<== report: ok" in out and "reproduces" in out
    # As a browser procedure's: it runs while the app is up, before the tests.
    assert out.index("==> start") < out.index("==> report") < out.index("==> tests")
    logs = assert_nothing_left(tmp_path)
    found = json.loads((logs / "reproduction" / "reproduction.json").read_text())
    assert found["runs"][0]["steps"][0]["stdout"] == "2375\n"
    assert git("status", "--porcelain", cwd=repo) == ""


def test_a_report_without_a_block_cannot_be_checked_without_a_model(tmp_path: Path) -> None:
    require_bubblewrap()
    repo = checkout(
        tmp_path / "lib",
        {"ok.py": "X = 1\n", "ISSUE.md": "It breaks sometimes.\n"},
        {"start": "python3 -m http.server $PORT", "test": "python3 -c 'import ok'"},
    )
    done = durafix_check(tmp_path, repo, "--report", str(repo / "ISSUE.md"))
    assert done.returncode == 3, done.stdout + done.stderr
    assert "has no ```durafix-repro block: a run would ask the model to draft one" in done.stdout
    assert "does only with a model configured" in done.stdout
    # No reproduction to run and a `start` in the recipe: the app is started, then stopped.
    assert "<== start: ok" in done.stdout
    assert_nothing_left(tmp_path)


def test_an_invalid_recipe_names_the_field(tmp_path: Path) -> None:
    require_bubblewrap()
    repo = checkout(tmp_path / "lib", {"ok.py": "X = 1\n"}, {"start": "true", "test": "true", "tset": "typo"})
    done = durafix_check(tmp_path, repo)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "unknown keys: tset" in done.stdout
    assert "==> setup" not in done.stdout
    assert_nothing_left(tmp_path)


# ---- libraries installed from the registries, with a command and a test report --------------------------------

STATS = """import humanize


def mean(xs):
    return sum(xs) / (len(xs) + 1)


def shown(n):
    return humanize.intcomma(n)
"""
PIP_RECIPE: dict[str, object] = {
    "setup": ["python3 -m venv .venv", ".venv/bin/pip install --quiet -r requirements.txt"],
    "setup_network": True,
    # This library has no app; the recipe still names a start (the field is required), which is never run.
    "start": "false",
    "test": ".venv/bin/python -m unittest discover -s tests -t .",
    "test_subset": ".venv/bin/python -m unittest {ids}",
}
PIP_TEST = """import unittest

from stats import shown


class Shown(unittest.TestCase):
    def test_commas(self):
        self.assertEqual(shown(1234), "1,234")
"""
PIP_COMMAND_REPORT = """The mean of 2 and 4 comes out as 2.0.

```durafix-repro
version: 1
kind: command
name: mean of [2, 4]
runs: 2
steps:
  - run: .venv/bin/python -c "from stats import mean; print(mean([2, 4]))"
    timeout_s: 60
bug_present:
  - {check: stdout, not_equals: "3.0"}
  - {check: exit_status, equals: "0"}
```
"""
PIP_TEST_REPORT = """The mean of two numbers is wrong; this test shows it.

```durafix-repro
version: 1
kind: test
name: mean of two numbers
files:
  tests/test_issue_1.py: |
    import unittest
    from stats import mean

    class MeanOfTwo(unittest.TestCase):
        def test_mean_of_two(self):
            self.assertEqual(mean([2, 4]), 3)
tests: [tests.test_issue_1]
```
"""


@pytest.mark.slow
def test_a_pip_library_with_a_command_and_a_test_report(tmp_path: Path) -> None:
    require_bubblewrap()
    repo = checkout(
        tmp_path / "stats",
        {
            "stats.py": STATS,
            "requirements.txt": "humanize==4.9.0\n",
            "tests/__init__.py": "",
            "tests/test_shown.py": PIP_TEST,
            ".gitignore": ".venv/\n",
            "COMMAND.md": PIP_COMMAND_REPORT,
            "TEST.md": PIP_TEST_REPORT,
        },
        PIP_RECIPE,
    )
    out = passing_check(tmp_path, repo, "COMMAND.md")
    assert "<== setup: ok" in out and "setup: python3 -m venv .venv" in out
    assert "--- start: skipped, not needed: the reproduction runs in the sandbox, without the app" in out
    assert "<== tests: ok" in out
    assert "==> report: command reproduction 'mean of [2, 4]', 2 run(s)" in out
    assert "<== report: ok" in out and "reproduces" in out
    logs = assert_nothing_left(tmp_path)
    found = json.loads((logs / "reproduction" / "reproduction.json").read_text())
    assert [run["steps"][0]["stdout"] for run in found["runs"]] == ["2.0\n", "2.0\n"]

    again = passing_check(tmp_path, repo, "TEST.md")
    # The second check's setup is the first one's, restored from the worker's dependency cache.
    assert "restoring .venv from the dependency cache" in again
    assert "==> report: test reproduction 'mean of two numbers'" in again
    assert "<== report: ok" in again
    assert_nothing_left(tmp_path)


TALLY = """const isNumber = require("is-number");

function total(values) {
  return values.filter((v) => isNumber(v)).reduce((sum, v) => sum + v, 0);
}

module.exports = { total };
"""
NPM_RECIPE: dict[str, object] = {
    "setup": ["npm ci --no-audit --no-fund"],
    "setup_network": True,
    "start": "false",
    "test": "node --test",
    "test_subset": "node --test {files}",
}
NPM_TEST = """const test = require("node:test");
const assert = require("node:assert");
const { total } = require("../index");

test("the total of nothing is 0", () => {
  assert.strictEqual(total([]), 0);
});
"""
NPM_COMMAND_REPORT = """Counts given as strings are concatenated.

```durafix-repro
version: 1
kind: command
name: total of string counts
steps:
  - run: node -e 'console.log(require("./index").total(["3", "4"]))'
bug_present:
  - {check: stdout, not_equals: "7"}
```
"""
NPM_TEST_REPORT = """Counts given as strings are concatenated.

```durafix-repro
version: 1
kind: test
name: string counts are added
files:
  test/issue.test.js: |
    const test = require("node:test");
    const assert = require("node:assert");
    const { total } = require("../index");
    test("string counts are added", () => {
      assert.strictEqual(total(["3", "4"]), 7);
    });
tests: [test/issue.test.js]
```
"""


@pytest.mark.slow
def test_an_npm_library_with_a_command_and_a_test_report(tmp_path: Path) -> None:
    require_bubblewrap()
    repo = checkout(
        tmp_path / "tally",
        {
            **is_number_package("tally"),
            "index.js": TALLY,
            "test/total.test.js": NPM_TEST,
            "COMMAND.md": NPM_COMMAND_REPORT,
            "TEST.md": NPM_TEST_REPORT,
        },
        NPM_RECIPE,
    )
    out = passing_check(tmp_path, repo, "COMMAND.md")
    assert "setup: npm ci --no-audit --no-fund" in out
    assert "--- start: skipped" in out
    assert "<== report: ok" in out and "reproduces" in out
    assert_nothing_left(tmp_path)

    again = passing_check(tmp_path, repo, "TEST.md")
    assert "==> report: test reproduction 'string counts are added'" in again
    assert "<== report: ok" in again
    assert_nothing_left(tmp_path)


# ---- broken recipes: each failure names its fix ------------------------------------------------------------


@pytest.mark.slow
def test_setup_that_needs_the_network_without_it_names_setup_network(tmp_path: Path) -> None:
    require_bubblewrap()
    recipe = {**PIP_RECIPE, "setup_network": False}
    repo = checkout(tmp_path / "stats", {"stats.py": STATS, "requirements.txt": "humanize==4.9.0\n"}, recipe)
    done = durafix_check(tmp_path, repo)
    assert done.returncode == 5, done.stdout + done.stderr
    out = done.stdout
    assert "<== setup: FAILED" in out
    assert "fix: setup has no network: the recipe does not say `setup_network: true`" in out
    logs = assert_nothing_left(tmp_path)
    assert f"log: {logs / 'environment.log'}" in out
    assert (
        "Could not" in (logs / "environment.log").read_text()
        or "from versions: none" in (logs / "environment.log").read_text()
    )
    assert "==> tests" not in out


def test_a_start_that_never_listens_names_the_port(tmp_path: Path) -> None:
    require_bubblewrap()
    token = f"never-listens-{uuid.uuid4().hex[:8]}"
    recipe = {
        "start": f"echo {token}; sleep 600",
        "readiness": {"path": "/", "deadline_s": 3},
        "test": "true",
    }
    repo = checkout(tmp_path / "app", {"README": "an app\n"}, recipe)
    done = durafix_check(tmp_path, repo)
    assert done.returncode == 6, done.stdout + done.stderr
    out = done.stdout
    assert "<== start: FAILED" in out
    assert "fix: nothing answered on the app's port: `start` must make the app listen on `$PORT`" in out
    logs = assert_nothing_left(tmp_path, token)
    assert f"log: {logs / 'environment.log'}" in out
    assert "# readiness: nothing answered on $PORT" in (logs / "environment.log").read_text()
    # The tests still ran: setup had succeeded.
    assert "<== tests: ok" in out


def test_a_test_command_that_does_not_exist_is_named(tmp_path: Path) -> None:
    require_bubblewrap()
    repo = checkout(tmp_path / "lib", {"ok.py": "X = 1\n"}, {"start": "false", "test": "no-such-test-runner --all"})
    report = tmp_path / "ISSUE.md"
    report.write_text(
        "```durafix-repro\nversion: 1\nkind: command\nname: one\nsteps: [{run: echo broken}]\n"
        "bug_present: [{check: stdout, contains: broken}]\n```\n"
    )
    done = durafix_check(tmp_path, repo, "--report", str(report))
    assert done.returncode == 7, done.stdout + done.stderr
    out = done.stdout
    assert "<== tests: FAILED" in out and "could not run (exit 127" in out
    assert "fix: `no-such-test-runner` was not found where the tests command runs" in out
    # The report still ran, and reproduced: the first failure (the tests) gives the exit code.
    assert "<== report: ok" in out
    assert_nothing_left(tmp_path)


def test_a_test_report_on_a_recipe_without_test_subset_is_told_to_add_one(tmp_path: Path) -> None:
    """A ``test`` reproduction runs its tests with ``test_subset``; without one nothing runs, and the fix printed
    is that line of the recipe, not a pointer to a log that holds no run."""
    require_bubblewrap()
    passing = "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_one(self):\n        pass\n"
    files = {"lib.py": "X = 1\n", "test_lib.py": passing}
    repo = checkout(tmp_path / "lib", files, {"test": "python3 -m unittest discover"})
    report = tmp_path / "ISSUE.md"
    report.write_text(
        "X is 1\n\n```durafix-repro\nversion: 1\nkind: test\nname: x is two\n"
        'files: {tests/test_x.py: "from lib import X\\n\\ndef test_x():\\n    assert X == 2\\n"}\n'
        "tests: [tests/test_x.py]\n```\n"
    )
    done = durafix_check(tmp_path, repo, "--report", str(report))
    assert done.returncode == 10, done.stdout + done.stderr
    out = done.stdout
    assert "<== report: FAILED" in out and "declares none" in out, out
    assert "fix: add `test_subset` to durafix.yaml" in out, out
    assert "(e.g. `python -m pytest {files}`, `node --test {files}`)" in out, out
    assert "the runs disagreed" not in out, out
    assert_nothing_left(tmp_path)


def test_an_interrupted_check_stops_the_app_and_removes_what_it_made(tmp_path: Path) -> None:
    require_bubblewrap()
    token = f"interrupted-{uuid.uuid4().hex[:8]}"
    recipe = {"start": f"echo {token}; sleep 600", "readiness": {"path": "/", "deadline_s": 120}, "test": "true"}
    repo = checkout(tmp_path / "app", {"README": "an app\n"}, recipe)
    env = check_env(tmp_path)
    proc = subprocess.Popen(
        [str(DURAFIX), "check", str(repo)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as a terminal sends it: a suite started in the background by a shell without job control
        # inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while not running_with(f"echo {token}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running_with(f"echo {token}"), "the app never started"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "interrupted: everything the check started has been stopped and removed" in out
    assert_nothing_left(tmp_path, token)


def test_a_directory_that_is_not_a_checkout_cannot_be_checked_and_leaves_nothing(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "durafix.yaml").write_text("start: 'true'\ntest: 'true'\n")
    done = durafix_check(tmp_path, plain)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"durafix: {plain} is not a git checkout with a commit" in done.stderr
    assert list((tmp_path / "tmpdir").iterdir()) == []
