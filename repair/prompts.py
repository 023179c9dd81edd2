"""The messages that open a repair attempt.

The system prompt carries the marker line ``durafix-attempt: N`` so that an endpoint can tell attempts apart
(the scripted model server matches on it to answer attempt 1 and attempt 2 differently), and a revision on
review adds ``durafix-revision: N``: its workspace already holds the candidate under review, and its user
message carries what the review asked for.
"""

from __future__ import annotations

from repair.interface import RepairRequest

ATTEMPT_MARKER = "durafix-attempt"
REVISION_MARKER = "durafix-revision"

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


_REVISION = """

This is a revision: your workspace already holds the fix a reviewer reviewed. Change it as the review asks, \
keeping what it does not object to.

{marker}: {revision}"""


def system_prompt(request: RepairRequest) -> str:
    prompt = _SYSTEM.format(marker=ATTEMPT_MARKER, attempt=request.attempt)
    if request.revision:
        prompt += _REVISION.format(marker=REVISION_MARKER, revision=request.revision)
    return prompt


def user_prompt(request: RepairRequest) -> str:
    parts = [f"Bug report: {request.issue_title}", "", request.issue_body.strip()]
    if request.previous_failures:
        parts += ["", "Earlier attempts were rejected by verification:"]
        parts += [f"- attempt {n}: {why}" for n, why in enumerate(request.previous_failures, 1)]
        parts += ["Do not repeat them."]
    if request.revision:
        parts += ["", "A reviewer asked for changes to the fix in your workspace:", "", request.review_feedback.strip()]
    return "\n".join(parts)
