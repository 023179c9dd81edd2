"""Two libraries of our own shaped like real ones, with no server at all, for the end-to-end test of command and
test reproductions (:mod:`tests.e2e.test_library_reproductions`).

Each has one real dependency installed from the registry by the package manager's own client in the recipe's
``setup`` (``setup_network: true``), a test suite that passes on the base, a ``test_subset`` that runs named test
files, and two real bugs no committed test covers:

- ``statkit`` (pip, ``humanize``): ``median`` of an even count returns the upper middle value instead of the
  mean of the two (``median([1, 2, 3, 4])`` is 3, not 2.5); ``clamp`` returns the lower bound for a value above
  the upper one (``clamp(15, 0, 10)`` is 0). Tests: ``unittest`` in a ``.venv``.
- ``tallykit`` (npm, ``is-number``): ``total`` concatenates the numeric strings it should add (``"0345"`` instead
  of 12); ``clamp`` as statkit's. Tests: node's built-in runner (``node --test``).

Per library: the first bug reported with a ``command`` block, the second with a ``test`` block (the reporter's
test file travels in its ``files``), a command report whose runs disagree, and the first bug reported again
once the fix is merged (it passes on the base). The scripted model holds a fix for each bug, matched by the
report's title. The recipes declare no ``start``: these libraries serve no app, and no run of them provisions one.

A third bug per library is reported in prose only (no block): statkit's ``mean`` floors the mean of integers
(``mean([1, 2])`` is 1, not 1.5), tallykit's ``largest`` compares numbers as text (``largest([9, 10])`` is 9).
The scripted model drafts its reproduction as a ``test``: first a test that passes on the base (it asserts a
case the bug does not touch, so it is refused once it ran), then one that fails there; its repair fixes the code
and keeps the drafted test, which is the regression test of the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from repair.procedure_draft import SUBMIT, TASK_MARKER
from tests.support.gitrepo import commit_files, git
from tests.support.modelserver import tool_turn
from tests.support.projects import is_number_package
from tests.support.real_projects import Report


@dataclass(frozen=True)
class Bug:
    """One bug: the report that shows it, the scripted model's fix (matched by ``match`` in the report's first
    user message), and what the fixed file holds on ``main`` once the fix is merged (``fixed``: path, text)."""

    report: Report
    match: str
    fix_turns: list[dict[str, Any]]
    fixed: tuple[str, str]
    added_test: str


@dataclass(frozen=True)
class DraftedBug(Bug):
    """A bug reported in prose only (no block): ``drafts`` are the test reproductions the scripted model submits
    for it, in order (each a ``kind: test`` YAML writing ``added_test``); the last is the one that fails on the
    base. Its ``fix_turns`` fix the code and write no test: the drafted one, seeded into the repair, is kept."""

    drafts: tuple[str, ...]


@dataclass(frozen=True)
class Library:
    """One library: its commits (in order), its cached install directory, the bug reported with a command
    block, the one reported with a test block, a command report whose runs disagree, and the command report's
    bug reported again (once it is fixed), and the bug reported in prose only."""

    name: str
    commits: list[tuple[str, dict[str, str]]]
    cached_path: str
    command_bug: Bug
    test_bug: Bug
    flaky: Report
    again: Report
    prose_bug: DraftedBug


def repro_block(block: dict[str, Any]) -> str:
    return f"```durafix-repro\n{yaml.safe_dump(block, sort_keys=False)}```\n"


def command_report(title: str, prose: str, name: str, command: str, correct: str, runs: int = 1) -> Report:
    """A report whose ``command`` block runs ``command``; the bug is present when it exits 0 and prints anything
    but ``correct``."""
    block = {
        "version": 1,
        "kind": "command",
        "name": name,
        "steps": [{"run": command, "timeout_s": 60}],
        "bug_present": [{"check": "exit_status", "equals": "0"}, {"check": "stdout", "not_equals": correct}],
        "runs": runs,
    }
    return Report(title=title, body=prose + repro_block(block))


def failing_test_report(title: str, prose: str, name: str, path: str, test: str) -> Report:
    """A report whose ``test`` block writes the reporter's test ``path`` and runs it: the bug is present when it
    fails."""
    block = {"version": 1, "kind": "test", "name": name, "files": {path: test}, "tests": [path], "timeout_s": 120}
    return Report(title=title, body=prose + repro_block(block))


def flaky_report(title: str, name: str, command: str, correct: str) -> Report:
    """A report whose two runs disagree: the first runs ``command`` (which shows the bug), the second finds the
    marker the first left and prints ``correct``."""
    block = {
        "version": 1,
        "kind": "command",
        "name": name,
        "steps": [{"run": f"if [ -f .seen-once ]; then echo {correct}; else touch .seen-once; {command}; fi"}],
        "bug_present": [{"check": "stdout", "not_equals": correct}],
        "runs": 2,
    }
    prose = "Sometimes the result comes out wrong, sometimes it is right; I could not pin it down.\n\n"
    return Report(title=title, body=prose + repro_block(block))


def fix_turns(
    path: str, cause: str, old: str, new: str, test_path: str, test: str, summary: str
) -> list[dict[str, Any]]:
    """The scripted model's repair: read ``path``, replace ``old`` by ``new`` there, add a regression test."""
    return [
        {"content": cause, **tool_turn("read_file", path=path)},
        tool_turn("replace_in_file", path=path, old=old, new=new),
        {"content": "A regression test for it.", **tool_turn("write_file", path=test_path, content=test)},
        tool_turn("finish", summary=summary),
    ]


def code_fix_turns(path: str, cause: str, old: str, new: str, summary: str) -> list[dict[str, Any]]:
    """The scripted model's repair that writes no test (the drafted reproduction's test is already in the
    workspace): read ``path``, replace ``old`` by ``new`` there, finish."""
    return [
        {"content": cause, **tool_turn("read_file", path=path)},
        tool_turn("replace_in_file", path=path, old=old, new=new),
        tool_turn("finish", summary=summary),
    ]


def drafted_test(name: str, path: str, test: str) -> str:
    """A ``kind: test`` reproduction as the model submits it: ``test`` written at ``path``, and run."""
    block = {"version": 1, "kind": "test", "name": name, "files": {path: test}, "tests": [path], "timeout_s": 120}
    return yaml.safe_dump(block, sort_keys=False)


# ---- statkit: pip -----------------------------------------------------------------------------------------

STAT_MEDIAN_BUG = "    return ordered[middle]\n"
STAT_MEDIAN_FIX = (
    "    if len(ordered) % 2:\n        return ordered[middle]\n    return (ordered[middle - 1] + ordered[middle]) / 2\n"
)
STAT_MEAN_BUG = "    return sum(values) // len(values)\n"
STAT_MEAN_FIX = "    return sum(values) / len(values)\n"
STAT_CLAMP_BUG = "    if value > high:\n        return low\n"
STAT_CLAMP_FIX = "    if value > high:\n        return high\n"
STATKIT = f'''"""Small statistics for reports: medians, bounds, and totals as people read them."""

import humanize


def median(values):
    """The middle value of ``values``; for an even count, the mean of the two middle ones."""
    ordered = sorted(values)
    middle = len(ordered) // 2
{STAT_MEDIAN_BUG}

def mean(values):
    """The arithmetic mean of ``values``."""
{STAT_MEAN_BUG}

def clamp(value, low, high):
    """``value`` kept between ``low`` and ``high``."""
    if value < low:
        return low
{STAT_CLAMP_BUG}    return value


def describe(values):
    """The total of ``values`` grouped by thousands: 1234567 is 1,234,567."""
    return humanize.intcomma(sum(values))
'''
STAT_TESTS = """import unittest

from statkit import clamp, describe, median


class StatkitTest(unittest.TestCase):
    def test_median_of_an_odd_count_is_the_middle_value(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_clamp_keeps_values_within_the_bounds(self):
        self.assertEqual(clamp(5, 0, 10), 5)
        self.assertEqual(clamp(-5, 0, 10), 0)

    def test_totals_are_grouped_by_thousands(self):
        self.assertEqual(describe([1000000, 234567]), "1,234,567")


if __name__ == "__main__":
    unittest.main()
"""
STAT_MEDIAN_TEST = """import unittest

from statkit import median


class MedianTest(unittest.TestCase):
    def test_median_of_an_even_count_is_the_mean_of_the_middle_values(self):
        self.assertEqual(median([1, 2, 3, 4]), 2.5)


if __name__ == "__main__":
    unittest.main()
"""
STAT_CLAMP_REPORT_TEST = """import unittest

from statkit import clamp


class ClampReport(unittest.TestCase):
    def test_a_value_above_the_maximum_is_the_maximum(self):
        self.assertEqual(clamp(15, 0, 10), 10)
"""
STAT_CLAMP_TEST = """import unittest

from statkit import clamp


class ClampAboveTest(unittest.TestCase):
    def test_a_value_above_the_maximum_is_the_maximum(self):
        self.assertEqual(clamp(15, 0, 10), 10)


if __name__ == "__main__":
    unittest.main()
"""
STAT_MEAN_REPORT = Report(
    title="statkit: mean drops the fraction",
    body="""`mean` floors its result when the values are integers:

```python
>>> from statkit import mean
>>> mean([1, 2])
1
```

It should be 1.5. `mean([2, 4])` comes out right (3), so it only shows when the sum does not divide evenly by
the count. Seen on main.
""",
)
STAT_MEAN_PASSING_DRAFT = """import unittest

from statkit import mean


class MeanOfIntegersTest(unittest.TestCase):
    def test_mean_of_integers(self):
        self.assertEqual(mean([2, 4]), 3)
"""
STAT_MEAN_DRAFT = """import unittest

from statkit import mean


class MeanOfIntegersTest(unittest.TestCase):
    def test_mean_of_integers_keeps_the_fraction(self):
        self.assertEqual(mean([1, 2]), 1.5)
"""
STAT_MEAN_TEST_PATH = "tests/test_issue_mean.py"
STAT_SETUP = ["python3 -m venv .venv", ".venv/bin/pip install --quiet -r requirements.txt"]
STAT_RECIPE: dict[str, Any] = {
    "setup": STAT_SETUP,
    "setup_network": True,
    "test": ".venv/bin/python -m unittest discover -s tests -t .",
    "test_subset": ".venv/bin/python -m unittest {files}",
    "lock_files": ["requirements.txt"],
}
STAT_MEDIAN_COMMAND = '.venv/bin/python -c "from statkit import median; print(median([1, 2, 3, 4]))"'

STATKIT_LIBRARY = Library(
    name="statkit",
    commits=[
        ("statkit: requirements", {"requirements.txt": "humanize==4.11.0\n", ".gitignore": ".venv/\n"}),
        ("Medians, bounds and totals", {"statkit.py": STATKIT}),
        ("Tests", {"tests/__init__.py": "", "tests/test_statkit.py": STAT_TESTS}),
        ("durafix recipe", {"durafix.yaml": yaml.safe_dump(STAT_RECIPE, sort_keys=False)}),
    ],
    cached_path=".venv",
    command_bug=Bug(
        report=command_report(
            "statkit: median of an even count is wrong",
            "`median([1, 2, 3, 4])` prints 3. The median of an even count is the mean of the two middle values: "
            "2.5.\n\n",
            "median of an even count",
            STAT_MEDIAN_COMMAND,
            "2.5",
        ),
        match="(?i)statkit: median of an even count",
        fix_turns=fix_turns(
            "statkit.py",
            "median returns the upper middle value whatever the count.",
            STAT_MEDIAN_BUG,
            STAT_MEDIAN_FIX,
            "tests/test_median.py",
            STAT_MEDIAN_TEST,
            "median returned ordered[len // 2] for every count; for an even count it now returns the mean of the "
            "two middle values. Added tests/test_median.py, which fails on the old code.",
        ),
        fixed=("statkit.py", "(ordered[middle - 1] + ordered[middle]) / 2"),
        added_test="tests/test_median.py",
    ),
    test_bug=Bug(
        report=failing_test_report(
            "statkit: clamp lets a value above the maximum fall to the minimum",
            "`clamp(15, 0, 10)` is 0; it should be 10. My test below fails.\n\n",
            "clamp above the maximum",
            "tests/test_clamp_report.py",
            STAT_CLAMP_REPORT_TEST,
        ),
        match="(?i)statkit: clamp lets a value above",
        fix_turns=fix_turns(
            "statkit.py",
            "clamp returns low for a value above high.",
            STAT_CLAMP_BUG,
            STAT_CLAMP_FIX,
            "tests/test_clamp_above.py",
            STAT_CLAMP_TEST,
            "clamp returned the lower bound for a value above the upper one; it now returns the upper bound. "
            "Added tests/test_clamp_above.py, which fails on the old code.",
        ),
        fixed=("statkit.py", STAT_CLAMP_FIX.strip().splitlines()[-1].strip()),
        added_test="tests/test_clamp_above.py",
    ),
    flaky=flaky_report("statkit: median is sometimes off", "median sometimes off", STAT_MEDIAN_COMMAND, "2.5"),
    again=command_report(
        "statkit 1.1: median([1, 2, 3, 4]) still looks wrong to me",
        "A colleague says the median of 1, 2, 3, 4 still comes out as 3.\n\n",
        "median again",
        STAT_MEDIAN_COMMAND,
        "2.5",
    ),
    prose_bug=DraftedBug(
        report=STAT_MEAN_REPORT,
        match="(?i)statkit: mean drops the fraction",
        fix_turns=code_fix_turns(
            "statkit.py",
            "mean divides with //, which floors the result for integers.",
            STAT_MEAN_BUG,
            STAT_MEAN_FIX,
            "mean floored the result with integer division; it now divides with /. The drafted test "
            f"{STAT_MEAN_TEST_PATH} fails on the old code and passes now.",
        ),
        fixed=("statkit.py", STAT_MEAN_FIX.strip()),
        added_test=STAT_MEAN_TEST_PATH,
        drafts=(
            drafted_test("mean of integers", STAT_MEAN_TEST_PATH, STAT_MEAN_PASSING_DRAFT),
            drafted_test("mean of integers keeps the fraction", STAT_MEAN_TEST_PATH, STAT_MEAN_DRAFT),
        ),
    ),
)


# ---- tallykit: npm ----------------------------------------------------------------------------------------

TALLY_TOTAL_BUG = "  return values.filter((v) => isNumber(v)).reduce((sum, v) => sum + v, 0);\n"
TALLY_TOTAL_FIX = "  return values.filter((v) => isNumber(v)).reduce((sum, v) => sum + Number(v), 0);\n"
TALLY_LARGEST_BUG = "  return [...values].sort().pop();\n"
TALLY_LARGEST_FIX = "  return [...values].sort((a, b) => a - b).pop();\n"
TALLY_CLAMP_BUG = "  if (value > high) return low;\n"
TALLY_CLAMP_FIX = "  if (value > high) return high;\n"
TALLYKIT = f"""const isNumber = require("is-number");

// The sum of the values that are numbers (numeric strings too, as forms send them); others are skipped.
function total(values) {{
{TALLY_TOTAL_BUG}}}

// `value` kept between `low` and `high`.
function clamp(value, low, high) {{
  if (value < low) return low;
{TALLY_CLAMP_BUG}  return value;
}}

// The largest of `values`, all numbers.
function largest(values) {{
{TALLY_LARGEST_BUG}}}

module.exports = {{ total, clamp, largest }};
"""
TALLY_TESTS = """const test = require("node:test");
const assert = require("node:assert");
const { total, clamp } = require("../lib");

test("the total of nothing is 0", () => {
  assert.strictEqual(total([]), 0);
});

test("values that are not numbers are skipped", () => {
  assert.strictEqual(total([2, "n/a", 3]), 5);
});

test("clamp keeps values within the bounds", () => {
  assert.strictEqual(clamp(5, 0, 10), 5);
  assert.strictEqual(clamp(-5, 0, 10), 0);
});
"""
TALLY_TOTAL_TEST = """const test = require("node:test");
const assert = require("node:assert");
const { total } = require("../lib");

test("counts given as strings are added, not concatenated", () => {
  assert.strictEqual(total(["3", "4", "n/a", "5"]), 12);
});
"""
TALLY_CLAMP_REPORT_TEST = """const test = require("node:test");
const assert = require("node:assert");
const { clamp } = require("../lib");

test("a value above the maximum is the maximum", () => {
  assert.strictEqual(clamp(15, 0, 10), 10);
});
"""
TALLY_LARGEST_REPORT = Report(
    title="tallykit: largest picks 9 over 10",
    body="""```js
const { largest } = require("tallykit");
largest([9, 10]); // 9
```

It should be 10. It looks like the numbers are compared as text: the answer is right as long as every value
has the same number of digits (`largest([1, 2, 3])` is 3).
""",
)
TALLY_LARGEST_PASSING_DRAFT = """const test = require("node:test");
const assert = require("node:assert");
const { largest } = require("../lib");

test("largest is the greatest value", () => {
  assert.strictEqual(largest([1, 2, 3]), 3);
});
"""
TALLY_LARGEST_DRAFT = """const test = require("node:test");
const assert = require("node:assert");
const { largest } = require("../lib");

test("largest compares numbers, not their digits", () => {
  assert.strictEqual(largest([9, 10]), 10);
});
"""
TALLY_LARGEST_TEST_PATH = "test/issue-largest.test.js"
TALLY_RECIPE = {
    "setup": ["npm ci --no-audit --no-fund"],
    "setup_network": True,
    "test": "npm test",
    "test_subset": "node --test {files}",
    "lock_files": ["package-lock.json"],
}
TALLY_TOTAL_COMMAND = """node -e 'console.log(require("./lib").total(["3", "4", "n/a", "5"]))'"""

TALLYKIT_LIBRARY = Library(
    name="tallykit",
    commits=[
        (
            "tallykit: package.json with is-number",
            is_number_package(
                "tallykit", description="Totals and bounds", main="lib/index.js", scripts={"test": "node --test"}
            ),
        ),
        ("Totals and bounds", {"lib/index.js": TALLYKIT}),
        ("Tests", {"test/tallykit.test.js": TALLY_TESTS}),
        ("durafix recipe", {"durafix.yaml": yaml.safe_dump(TALLY_RECIPE, sort_keys=False)}),
    ],
    cached_path="node_modules",
    command_bug=Bug(
        report=command_report(
            "tallykit: total concatenates the counts",
            'total(["3", "4", "n/a", "5"]) prints 0345; the counts that are numbers add up to 12.\n\n',
            "total of numeric strings",
            TALLY_TOTAL_COMMAND,
            "12",
        ),
        match="(?i)tallykit: total concatenates",
        fix_turns=fix_turns(
            "lib/index.js",
            "The counts are strings, so sum + v concatenates them.",
            TALLY_TOTAL_BUG,
            TALLY_TOTAL_FIX,
            "test/total-strings.test.js",
            TALLY_TOTAL_TEST,
            "total() added numeric strings as strings, so they were concatenated (0345). It now converts each "
            "value with Number() first. Added test/total-strings.test.js, which fails on the old code.",
        ),
        fixed=("lib/index.js", "sum + Number(v)"),
        added_test="test/total-strings.test.js",
    ),
    test_bug=Bug(
        report=failing_test_report(
            "tallykit: clamp lets a value above the maximum fall to the minimum",
            "clamp(15, 0, 10) is 0; it should be 10. My test below fails.\n\n",
            "clamp above the maximum",
            "test/clamp-report.test.js",
            TALLY_CLAMP_REPORT_TEST,
        ),
        match="(?i)tallykit: clamp lets a value above",
        fix_turns=fix_turns(
            "lib/index.js",
            "clamp returns low for a value above high.",
            TALLY_CLAMP_BUG,
            TALLY_CLAMP_FIX,
            "test/clamp-above.test.js",
            TALLY_CLAMP_REPORT_TEST,
            "clamp returned the lower bound for a value above the upper one; it now returns the upper bound. "
            "Added test/clamp-above.test.js, which fails on the old code.",
        ),
        fixed=("lib/index.js", TALLY_CLAMP_FIX.strip()),
        added_test="test/clamp-above.test.js",
    ),
    flaky=flaky_report(
        "tallykit: total is sometimes off",
        "total sometimes off",
        TALLY_TOTAL_COMMAND,
        "12",
    ),
    again=command_report(
        "tallykit 1.1: the total of 3, 4 and 5 still looks wrong",
        "A colleague says total still concatenates the counts.\n\n",
        "total again",
        TALLY_TOTAL_COMMAND,
        "12",
    ),
    prose_bug=DraftedBug(
        report=TALLY_LARGEST_REPORT,
        match="(?i)tallykit: largest picks 9 over 10",
        fix_turns=code_fix_turns(
            "lib/index.js",
            "sort() without a comparator orders the numbers as strings.",
            TALLY_LARGEST_BUG,
            TALLY_LARGEST_FIX,
            "largest sorted the values as strings, so 9 came after 10; it now sorts them numerically. The "
            f"drafted test {TALLY_LARGEST_TEST_PATH} fails on the old code and passes now.",
        ),
        fixed=("lib/index.js", TALLY_LARGEST_FIX.strip()),
        added_test=TALLY_LARGEST_TEST_PATH,
        drafts=(
            drafted_test("largest of small numbers", TALLY_LARGEST_TEST_PATH, TALLY_LARGEST_PASSING_DRAFT),
            drafted_test("largest compares numbers", TALLY_LARGEST_TEST_PATH, TALLY_LARGEST_DRAFT),
        ),
    ),
)

LIBRARIES = (STATKIT_LIBRARY, TALLYKIT_LIBRARY)


def build_library(library: Library, parent: Path) -> Path:
    """``parent/<name>``: a git checkout on ``main`` with the library's commits."""
    root = parent / library.name
    root.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=root)
    for message, files in library.commits:
        commit_files(root, files, message)
    return root


def draft_conversation(library: Library) -> str:
    """The name of the scripted conversation that drafts ``library``'s prose bug's reproduction."""
    return f"draft-{library.name}-prose"


def model_script(dest: Path) -> Path:
    """The scripted model's answers: each bug's fix, for the report whose title names it, and the drafts of the
    prose bug's reproduction, one per turn (a request holding k assistant messages, the k refused drafts, gets
    draft k + 1). The drafting conversations come first: a drafting request names the report's title too."""
    drafting = [
        {
            "name": draft_conversation(library),
            "match": {"system": re.escape(TASK_MARKER), "user": library.prose_bug.match},
            "turns": [tool_turn(SUBMIT, yaml=draft) for draft in library.prose_bug.drafts],
        }
        for library in LIBRARIES
    ]
    conversations = drafting + [
        {"name": f"fix-{library.name}-{kind}", "match": {"user": bug.match}, "turns": bug.fix_turns}
        for library in LIBRARIES
        for kind, bug in (
            ("command", library.command_bug),
            ("test", library.test_bug),
            ("prose", library.prose_bug),
        )
    ]
    dest.write_text(yaml.safe_dump({"model": "durafix-scripted", "conversations": conversations}, sort_keys=False))
    return dest
