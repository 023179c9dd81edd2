"""The messages that open a repair attempt.

The system prompt carries the marker line ``durafix-attempt: N`` so that an endpoint can tell attempts apart
(the scripted model server matches on it to answer attempt 1 and attempt 2 differently), and a revision on
review adds ``durafix-revision: N``: its workspace already holds the candidate under review, and its user
message carries what the review asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

from repair.context import RepairContext
from repair.interface import RepairRequest

ATTEMPT_MARKER = "durafix-attempt"
REVISION_MARKER = "durafix-revision"

_SYSTEM = """You are durafix's repair agent. The repository of a web application is checked out in your \
workspace at the revision where a bug was reported. Find the cause of the bug and fix it in the code.

How to work:
- Use the tools to look around (list_files, search, read_file) before you edit.
- Make the smallest change that fixes the cause; do not reformat or touch unrelated code.
- Add or extend an automated test that fails without your fix and passes with it.
- {running}
- Edit with replace_in_file (the old text must occur exactly once) or write_file (new files).
- When done, call finish with a short summary of the cause and the change.

{marker}: {attempt}"""


_REVISION = """

This is a revision: your workspace already holds the fix a reviewer reviewed. Change it as the review asks, \
keeping what it does not object to.

{marker}: {revision}"""

_NO_RUNS = "You cannot run commands; durafix runs the tests and replays the bug in a browser after you finish."
_RUNS = {
    "run_tests": "run_tests runs the repository's tests (or the test files you name) on your workspace as it is",
    "run_reproduction": "run_reproduction replays the bug report in a browser against your workspace's app",
    "run": "run runs one of the commands the repository allows",
}
# A command or test reproduction runs in the sandbox, not in a browser: said so where the browser's would be.
_NO_RUNS_SANDBOX = (
    "You cannot run commands; durafix runs the tests and replays the bug's reproduction (in the sandbox) after you "
    "finish."
)
_REPRODUCTION_SANDBOX = "run_reproduction replays the bug report's reproduction (commands or tests) on your workspace"
_RUNS_TAIL = (
    "; each runs in a sandbox without network. Use them to check your change before you finish; durafix "
    "verifies the result again after you finish. A result that says 'interrupted' was lost: call again if needed."
)


def system_prompt(request: RepairRequest, runs: Sequence[str] = (), reproduction_kind: str = "browser") -> str:
    """The system prompt; ``runs`` are the run tools offered (none: the model is told it cannot run anything).
    A revision adds what it is and its marker. ``reproduction_kind``: the run's reproduction's (a browser one's
    prompt is what it was before kinds existed)."""
    said = dict(_RUNS)
    if reproduction_kind != "browser":
        said["run_reproduction"] = _REPRODUCTION_SANDBOX
    none = _NO_RUNS if reproduction_kind == "browser" else _NO_RUNS_SANDBOX
    running = "; ".join(said[r] for r in said if r in runs) + _RUNS_TAIL if runs else none
    prompt = _SYSTEM.format(marker=ATTEMPT_MARKER, attempt=request.attempt, running=running)
    if request.revision:
        prompt += _REVISION.format(marker=REVISION_MARKER, revision=request.revision)
    return prompt


def user_prompt(request: RepairRequest, context: RepairContext | None = None) -> str:
    """The report, then the run's facts when ``context`` is given (its earlier attempts replace
    ``request.previous_failures``, which say only why each attempt failed)."""
    parts = [f"Bug report: {request.issue_title}", "", request.issue_body.strip()]
    if context is not None:
        facts = context.render()
        parts += ["", facts] if facts else []
    elif request.previous_failures:
        parts += ["", "Earlier attempts were rejected by verification:"]
        parts += [f"- attempt {n}: {why}" for n, why in enumerate(request.previous_failures, 1)]
        parts += ["Do not repeat them."]
    if request.revision:
        parts += ["", "A reviewer asked for changes to the fix in your workspace:", "", request.review_feedback.strip()]
    return "\n".join(parts)
