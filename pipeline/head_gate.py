"""The review gate on moved heads: what the run says when its PR's head moves under it.

A head of the run's PR that the run did not push (a maintainer's push to the run's branch, seen by the
``head_moved`` signal, by an approval naming it, or by the merge finding the head moved) is verified like any
candidate before anyone is asked to review it (``pipeline.flow.moved.MovedHeads.gate_moved_head``). Everything here is
pure (no I/O), so the workflow can call it.
"""

from __future__ import annotations


def _by(pusher: str) -> str:
    return f" by {pusher}" if pusher else ""


def head_verified_comment(old_head: str, new_head: str, pusher: str, digest: str, tests: str) -> str:
    """Said on the PR (keyed by ``new_head``) once a moved head passed verification."""
    return (
        f"The head of this pull request moved from `{old_head}` to `{new_head}`{_by(pusher)}. durafix verified "
        f"`{new_head}` on a fresh workspace (tests: {tests}; the reproduction replayed and the bug no longer "
        f"shows): its evidence (digest `{digest}`) is in the comment for `{new_head}`. An approval of "
        f"`{old_head}` does not cover it: to merge, a reviewer approves `{new_head}`."
    )


def head_failed_comment(old_head: str, new_head: str, pusher: str, why: str) -> str:
    """Said on the PR (keyed by ``new_head``) when a moved head failed verification."""
    return (
        f"The head of this pull request moved from `{old_head}` to `{new_head}`{_by(pusher)}, and `{new_head}` "
        f"did not pass durafix's verification: {why}. durafix does not offer it for approval and will not merge "
        "this pull request; the run ends here and needs a human. The branch and this PR are left as they are."
    )


def head_failed_detail(new_head: str, pusher: str, why: str) -> str:
    """The run's outcome detail (and ticket note) for a moved head that failed verification."""
    return (
        f"the PR head was moved to {new_head[:12]}{_by(pusher)} and it failed verification ({why}); "
        "not offered for approval, nothing merged"
    )


def head_verified_note(new_head: str, pusher: str, digest: str) -> str:
    """The ticket's note while the run waits for a review of a verified moved head."""
    return (
        f"the PR head moved to `{new_head[:12]}`{_by(pusher)}; verified, new evidence `{digest[:12]}`: "
        "waiting for a review of it"
    )


def not_under_review_detail(head: str, pending: str) -> str:
    """The answer to an approval naming a head of the PR that is not the one under review."""
    return (
        f"{head} is not the head under review ({pending}): durafix verifies it first and asks for a review of it "
        "once it passes; this approval is not recorded"
    )


# ---- a moved base branch (pipeline.flow.moved, reverify_on_moved_base) ---------------------------------


def base_verified_header(head: str, base_branch: str, new_base: str) -> str:
    """Opens the evidence comment of the head under review verified again on the base branch's new head."""
    return (
        f"`{base_branch}` moved to `{new_base}` since `{head}` was verified. durafix rebuilt the change on "
        f"`{new_base}` (the same change) and verified it there before merging:\n\n"
    )


def base_rebuilt_comment(head: str, base_branch: str, new_base: str, rebuilt: str, digest: str) -> str:
    return (
        f"`{base_branch}` moved to `{new_base}` since `{head}` was verified, and the change rebuilt on it is "
        f"pushed as `{rebuilt}` (replacing `{head}`), verified there: its evidence (digest `{digest}`) is in the "
        f"comment for `{rebuilt}`. An approval of `{head}` does not cover it: to merge, a reviewer approves "
        f"`{rebuilt}`."
    )


def base_rebuilt_note(base_branch: str, new_base: str, rebuilt: str) -> str:
    return (
        f"`{base_branch}` moved to `{new_base[:12]}`; the change was rebuilt on it as `{rebuilt[:12]}` and "
        "verified: waiting for a review of it"
    )


def base_conflict_comment(head: str, base_branch: str, new_base: str, why: str) -> str:
    return (
        f"`{base_branch}` moved to `{new_base}` since `{head}` was approved, and the change no longer applies on "
        f"it ({why}). durafix does not merge around a conflict: the run ends here and needs a human. The branch "
        "and this PR are left as they are."
    )


def base_conflict_detail(base_branch: str, new_base: str, why: str) -> str:
    return f"{base_branch} moved to {new_base[:12]} and the change no longer applies on it ({why}); nothing merged"


def base_failed_comment(head: str, base_branch: str, new_base: str, why: str) -> str:
    return (
        f"`{base_branch}` moved to `{new_base}` since `{head}` was verified; durafix rebuilt the change on it and "
        f"the result did not pass verification: {why}. Nothing is merged; the run ends here and needs a human."
    )


def base_failed_detail(base_branch: str, new_base: str, why: str) -> str:
    return (
        f"{base_branch} moved to {new_base[:12]} and the change rebuilt on it failed verification ({why}); "
        "nothing merged"
    )
