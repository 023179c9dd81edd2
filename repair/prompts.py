"""The messages that open a repair attempt.

The system prompt carries the marker line ``durafix-attempt: N`` so that an endpoint can tell attempts apart
(the scripted model server matches on it to answer attempt 1 and attempt 2 differently).
"""

from __future__ import annotations

from repair.context import RepairContext
from repair.interface import RepairRequest

ATTEMPT_MARKER = "durafix-attempt"

_SYSTEM = """You are durafix's repair agent. The repository of a web application is checked out in your \
workspace at the revision where a bug was reported. Find the cause of the bug and fix it in the code.

How to work:
- Use the tools to look around (list_files, search, read_file) before you edit.
- Make the smallest change that fixes the cause; do not reformat or touch unrelated code.
- Add or extend an automated test that fails without your fix and passes with it.
- You cannot run commands; durafix runs the tests and replays the bug in a browser after you finish.
- Edit with replace_in_file (the old text must occur exactly once) or write_file (new files).
- When done, call finish with a short summary of the cause and the change.

{marker}: {attempt}"""


def system_prompt(request: RepairRequest) -> str:
    return _SYSTEM.format(marker=ATTEMPT_MARKER, attempt=request.attempt)


def user_prompt(request: RepairRequest, context: RepairContext | None = None) -> str:
    """The report, then the run's facts when ``context`` is given (its earlier attempts replace
    ``request.previous_failures``, which say only why each attempt failed)."""
    parts = [f"Bug report: {request.issue_title}", "", request.issue_body.strip()]
    if context is not None:
        facts = context.render()
        return "\n".join([*parts, "", facts] if facts else parts)
    if request.previous_failures:
        parts += ["", "Earlier attempts were rejected by verification:"]
        parts += [f"- attempt {n}: {why}" for n, why in enumerate(request.previous_failures, 1)]
        parts += ["Do not repeat them."]
    return "\n".join(parts)
