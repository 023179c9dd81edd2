"""Two projects of our own shaped like the repositories durafix meets in the wild, for the end-to-end test of
onboarding and repairing them (:mod:`tests.e2e.test_real_projects`).

Each is a small web app with one real bug a browser shows, built on one real dependency installed from the
registry by the package manager's own client in the recipe's ``setup`` (never inside ``test``):

- ``tally`` (npm): a node server whose page adds up daily counts with ``is-number`` filtering out the
  entries that are not numbers; the counts arrive as strings, and ``total`` concatenates them
  (``Total: 0345`` instead of ``Total: 12``). Tests: node's built-in runner (``node --test``) and ``assert``.
- ``leaderboard`` (pip): a Python server whose page shows the players' points summed and formatted with
  ``humanize.intcomma``; ``total_points`` skips the first row, left over from when rows came from a CSV with
  a header (``Total points: 2,750`` instead of ``4,000``). Tests: ``unittest``; ``humanize`` in a ``.venv``.

Both servers listen on every interface (``0.0.0.0``), as an app must for the Docker provider, which reaches it
at its container's address (on the local provider that includes the loopback it is reached on).

Each history has more than 50 commits, every one of them tagged, so that the request of a mirror clone (a
``want`` line per ref) exceeds the size git gzips a request body at (about 1 KB). :data:`PROJECTS` also holds,
per project, the scripted model's fix (a patch of the cause plus a regression test), a wrong fix whose own
regression test fails (:func:`wrong_first_model_script` proposes it on the first attempt), the commit that moves
``main`` afterwards, and the two reports: the bug as first reported, and the same bug reported again from the
release after the fix, whose procedure checks that it runs on the moved ``main`` and then finds the behaviour
correct.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.ops.forge_setup import maintainer_git_env
from tests.support.gitrepo import commit_files, git
from tests.support.modelserver import tool_turn
from tests.support.projects import is_number_package

HISTORY_COMMITS = 55
"""Commits (each tagged) in every project's history: above the 50 that makes git gzip its requests."""


@dataclass(frozen=True)
class Report:
    """An issue: its title and its body (the prose and a ``durafix-repro`` block)."""

    title: str
    body: str


@dataclass(frozen=True)
class Project:
    """One project: what is committed first (in order, one commit each), the model's fix, and what follows.

    ``fix_turns`` are the model's turns of the right fix; ``wrong_turns`` those of a wrong one, which adds the same
    regression test but leaves the bug, so the candidate's tests fail.
    ``fixed`` is ``(path, text)``: the text the fix puts in that file, which ``main`` holds once it merged.
    ``move`` is the commit that moves ``main`` after the merge (path -> text, its message); the second report's
    procedure checks for ``moved_marker`` on the page before it looks at the bug.
    """

    name: str
    commits: list[tuple[str, dict[str, str]]]
    cached_path: str
    fix_turns: list[dict[str, Any]]
    wrong_turns: list[dict[str, Any]]
    fixed: tuple[str, str]
    added_test: str
    move: tuple[dict[str, str], str]
    first: Report
    again: Report


def procedure(name: str, preconditions: list[dict[str, Any]], selector: str, correct: str) -> str:
    """A ``durafix-repro`` block: open ``/``, check ``preconditions``; the bug is ``selector`` not showing
    ``correct``."""
    block = {
        "version": 1,
        "name": name,
        "steps": [
            {"action": "goto", "path": "/"},
            {"action": "wait_for", "selector": selector},
            *preconditions,
        ],
        "bug_present": [{"action": "expect_text", "selector": selector, "not_equals": correct}],
        "runs": 1,
    }
    return f"```durafix-repro\n{yaml.safe_dump(block, sort_keys=False)}```\n"


def total_report(title: str, prose: str, name: str, shown: tuple[str, str], total: str) -> Report:
    """An issue: ``prose``, then a procedure that checks the page shows ``shown`` (a selector and a text in it)
    and finds the bug when ``#total`` does not show ``total``."""
    selector, contains = shown
    precondition = {"action": "expect_text", "selector": selector, "contains": contains}
    return Report(title=title, body=prose + procedure(name, [precondition], "#total", total))


# ---- tally: npm ------------------------------------------------------------------------------------------

TALLY_TOTAL_BUG = "  return values.filter((v) => isNumber(v)).reduce((sum, v) => sum + v, 0);\n"
TALLY_TOTAL_FIX = "  return values.filter((v) => isNumber(v)).reduce((sum, v) => sum + Number(v), 0);\n"
# Wrong: it adds up only the values that are numbers already, so the counts (strings) add up to 0.
TALLY_TOTAL_WRONG = (
    '  return values.filter((v) => typeof v === "number" && isNumber(v)).reduce((sum, v) => sum + v, 0);\n'
)
TALLY_TOTAL = f"""const isNumber = require("is-number");

// The sum of the values that are numbers (or numeric strings, as a form sends them); others are skipped.
function total(values) {{
{TALLY_TOTAL_BUG}}}

module.exports = {{ total }};
"""
TALLY_ENTRIES = [
    {"day": "Mon", "count": "3"},
    {"day": "Tue", "count": "4"},
    {"day": "Wed", "count": "n/a"},
    {"day": "Thu", "count": "5"},
]
TALLY_FOOTER = ""
TALLY_FOOTER_MOVED = '<footer id="version">Tally 1.1</footer>'
TALLY_SERVER = """const http = require("http");
const { total } = require("./lib/total");
const entries = require("./data/entries.json");

function page() {
  const items = entries.map((e) => `<li>${e.day}: ${e.count}</li>`).join("");
  return `<!doctype html><html><head><meta charset="utf-8"><title>Tally</title></head><body>
<h1>Tally</h1><ul id="entries">${items}</ul>
<p id="total">Total: ${total(entries.map((e) => e.count))}</p>FOOTER
</body></html>`;
}

http
  .createServer((req, res) => {
    if (req.url === "/healthz") {
      res.writeHead(200, { "Content-Type": "text/plain" });
      res.end("ok\\n");
    } else if (req.url === "/") {
      res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
      res.end(page());
    } else {
      res.writeHead(404);
      res.end();
    }
  })
  .listen(Number(process.env.PORT || 3000), "0.0.0.0");
"""
TALLY_TEST = """const test = require("node:test");
const assert = require("node:assert");
const { total } = require("../lib/total");

test("the total of nothing is 0", () => {
  assert.strictEqual(total([]), 0);
});

test("values that are not numbers are skipped", () => {
  assert.strictEqual(total([2, "n/a", 3]), 5);
});
"""
TALLY_ADDED_TEST = """const test = require("node:test");
const assert = require("node:assert");
const { total } = require("../lib/total");

test("counts given as strings are added, not concatenated", () => {
  assert.strictEqual(total(["3", "4", "n/a", "5"]), 12);
});
"""
TALLY_RECIPE = {
    "setup": ["npm ci --no-audit --no-fund"],
    "setup_network": True,
    "start": "npm start",
    "port": 3000,
    "readiness": {"path": "/healthz", "expected_status": 200, "deadline_s": 30},
    "test": "npm test",
    "lock_files": ["package-lock.json"],
    # What the Docker provider's image needs (the local provider runs the worker's own node and npm).
    "image": {"packages": ["nodejs", "npm"]},
}

TALLY = Project(
    name="tally",
    commits=[
        (
            "Tally: package.json with is-number",
            is_number_package(
                "tally",
                description="Daily counts, added up",
                scripts={"start": "node server.js", "test": "node --test"},
            ),
        ),
        ("Add up the counts that are numbers", {"lib/total.js": TALLY_TOTAL}),
        ("Tests for total", {"test/total.test.js": TALLY_TEST}),
        (
            "Serve the tally page",
            {
                "server.js": TALLY_SERVER.replace("FOOTER", TALLY_FOOTER),
                "data/entries.json": json.dumps(TALLY_ENTRIES, indent=2) + "\n",
            },
        ),
        ("durafix recipe", {"durafix.yaml": yaml.safe_dump(TALLY_RECIPE, sort_keys=False)}),
    ],
    cached_path="node_modules",
    fix_turns=[
        {
            "content": "The page's total is built by total() in lib/total.js.",
            **tool_turn("read_file", path="lib/total.js"),
        },
        {
            "content": "The counts are strings, so sum + v concatenates them; they must be converted first.",
            **tool_turn("replace_in_file", path="lib/total.js", old=TALLY_TOTAL_BUG, new=TALLY_TOTAL_FIX),
        },
        {
            "content": "A regression test with the counts as the page gets them.",
            **tool_turn("write_file", path="test/strings.test.js", content=TALLY_ADDED_TEST),
        },
        tool_turn(
            "finish",
            summary="total() added the counts as strings, so they were concatenated (0345). It now converts each "
            "numeric value with Number() before adding. Added test/strings.test.js, which fails on the old code.",
        ),
    ],
    wrong_turns=[
        {
            "content": "The page's total is built by total() in lib/total.js.",
            **tool_turn("read_file", path="lib/total.js"),
        },
        {
            "content": "Strings should not be added at all: only values that are numbers belong in the total.",
            **tool_turn("replace_in_file", path="lib/total.js", old=TALLY_TOTAL_BUG, new=TALLY_TOTAL_WRONG),
        },
        {
            "content": "A regression test with the counts as the page gets them.",
            **tool_turn("write_file", path="test/strings.test.js", content=TALLY_ADDED_TEST),
        },
        tool_turn(
            "finish", summary="total() now adds only values that are numbers, so strings are never concatenated."
        ),
    ],
    fixed=("lib/total.js", "sum + Number(v)"),
    added_test="test/strings.test.js",
    move=(
        {
            "server.js": TALLY_SERVER.replace("FOOTER", TALLY_FOOTER_MOVED),
            "CHANGELOG.md": "## 1.1\n\n- The page shows the version.\n",
        },
        "Show the version in the footer",
    ),
    first=total_report(
        "Tally total concatenates the counts",
        "The tally page lists Mon: 3, Tue: 4, Wed: n/a, Thu: 5, and shows **Total: 0345**. The counts "
        "that are numbers add up to 12.\n\nExpected: `Total: 12`. Actual: `Total: 0345`.\n\n",
        "tally total concatenates counts",
        ("#entries", "Thu: 5"),
        "Total: 12",
    ),
    again=total_report(
        "Tally 1.1: the total still shows 0345",
        "A colleague on Tally 1.1 says the total reads 0345 for Mon 3, Tue 4, Thu 5. It should be 12.\n\n",
        "tally 1.1 total",
        ("#version", "Tally 1.1"),
        "Total: 12",
    ),
)


# ---- leaderboard: pip ------------------------------------------------------------------------------------

BOARD_TOTAL_BUG = "    return sum(points for _, points in rows[1:])\n"
BOARD_TOTAL_FIX = "    return sum(points for _, points in rows)\n"
# Wrong: it keeps the first player and drops the last, so the total is still short of one player's points.
BOARD_TOTAL_WRONG = "    return sum(points for _, points in rows[:-1])\n"
BOARD_SCORES = f'''"""The leaderboard's arithmetic: rows are (player, points)."""

import humanize


def total_points(rows):
    """The points of every player, added up."""
{BOARD_TOTAL_BUG}

def format_points(points):
    """Points as the page shows them: 1234567 is 1,234,567."""
    return humanize.intcomma(points)
'''
BOARD_ROWS = '''"""This season's players and their points."""

ROWS = [("Ada", 1250), ("Grace", 1500), ("Linus", 1250)]
'''
BOARD_FOOTER = ""
BOARD_FOOTER_MOVED = '<footer id="season">Season 2</footer>'
BOARD_APP = '''"""The leaderboard page, on $PORT."""

import os
from http.server import BaseHTTPRequestHandler, HTTPServer

from rows import ROWS
from scores import format_points, total_points


def page():
    items = "".join(f"<li>{name}: {format_points(points)}</li>" for name, points in ROWS)
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>Leaderboard</title></head><body>'
        f'<h1>Leaderboard</h1><ul id="players">{items}</ul>'
        f'<p id="total">Total points: {format_points(total_points(ROWS))}</p>FOOTER'
        "</body></html>"
    )


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/healthz":
            body, kind, status = b"ok\\n", "text/plain", 200
        elif self.path == "/":
            body, kind, status = page().encode(), "text/html; charset=utf-8", 200
        else:
            body, kind, status = b"", "text/plain", 404
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


if __name__ == "__main__":
    HTTPServer(("0.0.0.0", int(os.environ.get("PORT", "8000"))), Handler).serve_forever()
'''
BOARD_TEST = """import unittest

from scores import format_points, total_points


class ScoresTest(unittest.TestCase):
    def test_nobody_has_no_points(self):
        self.assertEqual(total_points([]), 0)

    def test_points_are_grouped_by_thousands(self):
        self.assertEqual(format_points(1234567), "1,234,567")


if __name__ == "__main__":
    unittest.main()
"""
BOARD_ADDED_TEST = """import unittest

from scores import total_points


class TotalTest(unittest.TestCase):
    def test_every_player_counts(self):
        self.assertEqual(total_points([("Ada", 1250), ("Grace", 1500), ("Linus", 1250)]), 4000)


if __name__ == "__main__":
    unittest.main()
"""
BOARD_RECIPE = {
    "setup": ["python3 -m venv .venv", ".venv/bin/pip install --quiet -r requirements.txt"],
    "setup_network": True,
    "start": ".venv/bin/python app.py",
    "port": 8000,
    "readiness": {"path": "/healthz", "expected_status": 200, "deadline_s": 30},
    "test": ".venv/bin/python -m unittest discover -s tests -t .",
    "lock_files": ["requirements.txt"],
    # What the Docker provider's image needs: Debian's python3 makes no virtual environment without python3-venv.
    "image": {"packages": ["python3", "python3-venv"]},
}

LEADERBOARD = Project(
    name="leaderboard",
    commits=[
        ("Leaderboard: requirements", {"requirements.txt": "humanize==4.11.0\n", ".gitignore": ".venv/\n"}),
        ("Total and format the points", {"scores.py": BOARD_SCORES, "rows.py": BOARD_ROWS}),
        ("Tests for the scores", {"tests/__init__.py": "", "tests/test_scores.py": BOARD_TEST}),
        ("Serve the leaderboard page", {"app.py": BOARD_APP.replace("FOOTER", BOARD_FOOTER)}),
        ("durafix recipe", {"durafix.yaml": yaml.safe_dump(BOARD_RECIPE, sort_keys=False)}),
    ],
    cached_path=".venv",
    fix_turns=[
        {
            "content": "The total on the page comes from total_points.",
            **tool_turn("search", pattern="def total_points"),
        },
        tool_turn("read_file", path="scores.py"),
        {
            "content": "rows[1:] drops the first player, as if the rows still had a CSV header.",
            **tool_turn("replace_in_file", path="scores.py", old=BOARD_TOTAL_BUG, new=BOARD_TOTAL_FIX),
        },
        {
            "content": "A regression test with this season's players.",
            **tool_turn("write_file", path="tests/test_total.py", content=BOARD_ADDED_TEST),
        },
        tool_turn(
            "finish",
            summary="total_points skipped the first row (rows[1:]), a leftover from rows read from a CSV with a "
            "header, so the leader's points were missing from the total. It now sums every row. Added "
            "tests/test_total.py, which fails on the old code.",
        ),
    ],
    wrong_turns=[
        tool_turn("read_file", path="scores.py"),
        {
            "content": "rows[1:] was meant to drop the totals row at the end of the CSV, not the leader: rows[:-1].",
            **tool_turn("replace_in_file", path="scores.py", old=BOARD_TOTAL_BUG, new=BOARD_TOTAL_WRONG),
        },
        {
            "content": "A regression test with this season's players.",
            **tool_turn("write_file", path="tests/test_total.py", content=BOARD_ADDED_TEST),
        },
        tool_turn("finish", summary="total_points dropped the first row instead of the CSV's trailing totals row."),
    ],
    fixed=("scores.py", BOARD_TOTAL_FIX.strip()),
    added_test="tests/test_total.py",
    move=(
        {"app.py": BOARD_APP.replace("FOOTER", BOARD_FOOTER_MOVED), "CHANGELOG.md": "## Season 2\n\n- Footer.\n"},
        "Name the season in the footer",
    ),
    first=total_report(
        "Leaderboard total leaves out the leader's points",
        "Ada has 1,250, Grace 1,500 and Linus 1,250 points, but the leaderboard says **Total points: "
        "2,750**: Ada's points are missing.\n\nExpected: `Total points: 4,000`.\n\n",
        "leaderboard total misses a player",
        ("#players", "Linus: 1,250"),
        "Total points: 4,000",
    ),
    again=total_report(
        "Season 2: the total points are too low",
        "In season 2 the leaderboard's total still looks too low to me: it should be 4,000.\n\n",
        "season 2 total",
        ("#season", "Season 2"),
        "Total points: 4,000",
    ),
)

PROJECTS = (TALLY, LEADERBOARD)


def build_checkout(project: Project, parent: Path) -> Path:
    """``parent/<name>``: a git checkout on ``main`` with the project's commits, then changelog releases up to
    :data:`HISTORY_COMMITS`, every commit tagged (``v1.0.<n>``; each tenth an annotated tag)."""
    root = parent / project.name
    root.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=root)
    changes = list(project.commits)
    changelog = ""
    for n in range(len(changes), HISTORY_COMMITS):
        changelog = f"- 1.0.{n}: release {n}\n" + changelog
        changes.append((f"Release 1.0.{n}", {"CHANGELOG.md": "# Changelog\n\n" + changelog}))
    for n, (message, files) in enumerate(changes):
        commit_files(root, files, message)
        if n % 10 == 9:
            git("tag", "-a", f"v1.0.{n}", "-m", f"Release 1.0.{n}", cwd=root)
        else:
            git("tag", f"v1.0.{n}", cwd=root)
    return root


def pull_and_commit(checkout: Path, clone_url: str, files: dict[str, str], message: str, tag: str) -> str:
    """What a maintainer does once durafix merged a fix, as docs/onboarding.md says: pull ``main`` from the
    forge into ``checkout`` (``git pull CLONE_URL main``, anonymously: the repository is public), then commit
    ``files`` there and tag the commit ``tag``; the new head."""
    git("pull", "-q", clone_url, "main", cwd=checkout)
    commit_files(checkout, files, message)
    git("tag", tag, cwd=checkout)
    return git("rev-parse", "HEAD", cwd=checkout)


def mirror_clone_request_encodings(clone_url: str, token: str, dest: Path) -> list[str]:
    """``git clone --mirror`` of ``clone_url`` into ``dest`` as the worker's mirror cache makes one, traced: the
    ``Content-Encoding`` of each request git sent (``identity`` for a plain one). With every ref a ``want`` line,
    a history with this many tags makes git gzip the request that negotiates the pack."""
    env = {**maintainer_git_env(token, dest.parent), "GIT_TRACE_CURL": "1", "GIT_TRACE_CURL_NO_DATA": "1"}
    done = subprocess.run(["git", "clone", "-q", "--mirror", clone_url, str(dest)], env=env, capture_output=True)
    trace = done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"git clone --mirror {clone_url}: {trace[-2000:]}"
    encodings: list[str] = []
    for line in trace.splitlines():
        header = line.partition("=> Send header: ")[2]
        if header.startswith("POST "):
            encodings.append("identity")
        elif header.lower().startswith("content-encoding:") and encodings:
            encodings[-1] = header.partition(":")[2].strip()
    return encodings


def model_script(dest: Path) -> Path:
    """The scripted model's answers: each project's fix, for the reports that name the project."""
    conversations = [
        {"name": f"fix-{p.name}", "match": {"user": f"(?i){p.name}"}, "turns": p.fix_turns} for p in PROJECTS
    ]
    dest.write_text(yaml.safe_dump({"model": "durafix-scripted", "conversations": conversations}, sort_keys=False))
    return dest


def wrong_first_model_script(dest: Path) -> Path:
    """The scripted model's answers: on a run's first repair attempt each project's wrong fix (its candidate's
    tests fail), on every later one its fix; for the reports that name the project. Attempts are told apart by
    the ``durafix-attempt: N`` line of the engine's system prompt."""
    conversations = [
        *(
            {
                "name": f"wrong-{p.name}",
                "match": {"user": f"(?i){p.name}", "system": r"durafix-attempt: 1\b"},
                "turns": p.wrong_turns,
            }
            for p in PROJECTS
        ),
        *({"name": f"fix-{p.name}", "match": {"user": f"(?i){p.name}"}, "turns": p.fix_turns} for p in PROJECTS),
    ]
    dest.write_text(yaml.safe_dump({"model": "durafix-scripted", "conversations": conversations}, sort_keys=False))
    return dest
