"""Draft pull requests, their state and reviews, readiness, and merging at an approved head.

`ensure_draft_pr(run_id, branch, base, ...)`: GitHub keeps at most one open PR per head and base and
refuses a second with 422 "A pull request already exists", so the create is uniquely keyed and may be
sent again after an ambiguous outcome. The open PR for the head is looked up first; it must carry this
run's marker `<!-- durafix:pr run=<run_id> -->`, otherwise it belongs to someone else: conflict. A found
PR whose description differs from `body` (a revision's) is edited to it; the title is left alone.

`merge(pr, approved_sha)`: passes `sha`, so GitHub refuses (409) if the head moved after approval. Every
expected refusal becomes a `MergeResult` status. An ambiguous merge is reconciled by reading the PR
(merged, head, merge commit); if it is not merged, the same conditional merge is sent once more. A merge
method the repository does not allow, and GitHub's transient 405 "Base branch was modified", are not refusals
of the PR: see `Pulls.merge`.

`get_pr` reads again while GitHub still computes `mergeable` (null right after a push).
"""

from __future__ import annotations

import time
from functools import partial

from github.PullRequest import PullRequest

from reviews.errors import (
    ForgeAmbiguousError,
    ForgeConflictError,
    ForgeError,
    ForgeMergeMethodError,
    ForgePermanentError,
    ForgeTransientError,
)
from reviews.markers import PULL, find_marker, pull_marker, with_marker
from reviews.models import MERGE_METHODS, MergeMethod, MergeResult, PullRef, PullState, ReviewInfo
from reviews.transport import Transport


def _run_of(pr: PullRequest) -> str | None:
    marker = find_marker(pr.body, PULL)
    return marker.attrs.get("run") if marker else None


def _pull_ref(pr: PullRequest, run_id: str, created: bool) -> PullRef:
    return PullRef(
        number=pr.number,
        html_url=pr.html_url,
        head_ref=pr.head.ref,
        head_sha=pr.head.sha,
        base_ref=pr.base.ref,
        draft=bool(pr.draft),
        run_id=run_id,
        created=created,
    )


class Pulls:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def ensure_draft(self, run_id: str, branch: str, base: str, title: str, body: str) -> PullRef:
        text = with_marker(body, pull_marker(run_id))

        def create() -> PullRequest:
            return self._t.repo.create_pull(base=base, head=branch, title=title, body=text, draft=True)

        for _ in range(2):
            existing = self._owned_open(run_id, branch, base)
            if existing is not None:
                self._with_body(existing, text)
                return _pull_ref(existing, run_id, created=False)
            try:
                pr = self._t.mutate(f"create draft PR {branch} -> {base}", create)
            except ForgeConflictError:
                # 422 "A pull request already exists": someone (maybe our own earlier attempt) made it.
                existing = self._owned_open(run_id, branch, base)
                if existing is None:
                    raise
                self._with_body(existing, text)
                return _pull_ref(existing, run_id, created=False)
            except ForgeAmbiguousError:
                # Read again, then resend: GitHub refuses a second open PR for this head and base.
                continue
            return _pull_ref(pr, run_id, created=True)
        raise ForgeAmbiguousError(f"creating the PR for {branch}: outcome unknown twice and no PR visible")

    def _with_body(self, pr: PullRequest, text: str) -> None:
        """Bring an existing PR's description to ``text`` (a revision updates it); an edit only when it differs,
        and an edit is idempotent, so a retry after an unanswered one just sends it again."""
        if (pr.body or "") != text:
            self._t.mutate(f"edit the body of PR #{pr.number}", lambda: pr.edit(body=text))

    def _owned_open(self, run_id: str, branch: str, base: str) -> PullRequest | None:
        """The open PR from `branch` into `base`; conflict if it is not this run's."""
        head = f"{self._t.config.owner}:{branch}"

        def scan() -> list[PullRequest]:
            pulls = self._t.repo.get_pulls(state="open", head=head, base=base)
            return [p for p in pulls if p.head.ref == branch and p.base.ref == base]

        found = self._t.read(f"find open PR for {head}", scan)
        if not found:
            return None
        pr = found[0]
        owner = _run_of(pr)
        if owner != run_id:
            raise ForgeConflictError(f"open PR #{pr.number} for {head} belongs to {owner or 'no durafix run'}")
        return pr

    def state(self, number: int) -> PullState:
        """The PR as GitHub reports it. `mergeable` is null for a while after a push, while GitHub computes it;
        an open PR reading null is read again (`mergeable_reads`, `mergeable_poll_s` apart) with conditional
        GETs, and `mergeable` stays None only if it is still unknown after the last read."""

        def read() -> PullState:
            pr = self._until_mergeable_known(self._t.repo.get_pull(number).complete())
            reviews = [
                ReviewInfo(
                    id=r.id,
                    user=r.user.login if r.user else "",
                    state=r.state,
                    commit_id=r.commit_id,
                    submitted_at=r.submitted_at,
                )
                for r in pr.get_reviews()
            ]
            return PullState(
                number=pr.number,
                state="closed" if pr.state == "closed" else "open",
                draft=bool(pr.draft),
                merged=bool(pr.merged),
                merge_commit_sha=pr.merge_commit_sha,
                head_ref=pr.head.ref,
                head_sha=pr.head.sha,
                base_ref=pr.base.ref,
                mergeable=pr.mergeable,
                reviews=reviews,
                run_id=_run_of(pr),
                author=pr.user.login if pr.user else "",
            )

        return self._t.read(f"read PR #{number}", read)

    def _until_mergeable_known(self, pr: PullRequest) -> PullRequest:
        """`pr`, read again until GitHub has computed `mergeable` (or the reads run out).

        Each re-read is `update()`: a GET with `If-None-Match`, so while nothing changed GitHub answers 304,
        which does not count against the rate limit. To be called inside `Transport.read`.
        """
        config = self._t.config
        for _ in range(config.mergeable_reads - 1):
            if pr.state != "open" or pr.merged or pr.mergeable is not None:
                break
            time.sleep(config.mergeable_poll_s)
            pr.update()
        return pr

    def list_by_run(self, run_id: str) -> list[int]:
        """Numbers of PRs in any state whose body carries this run's marker."""

        def scan() -> list[int]:
            return [p.number for p in self._t.repo.get_pulls(state="all") if _run_of(p) == run_id]

        return self._t.read(f"list PRs of run {run_id}", scan)

    def mark_ready(self, number: int) -> None:
        """Draft -> ready for review (GraphQL). Idempotent: a PR already ready is left alone."""
        for _ in range(2):
            pr = self._read_pull(number)
            if not pr.draft:
                return
            try:
                self._t.mutate(f"mark PR #{number} ready", pr.mark_ready_for_review)
                return
            except ForgeAmbiguousError:
                # The mutation is idempotent: re-read and, if still draft, send it again.
                continue
        raise ForgeAmbiguousError(f"marking PR #{number} ready: outcome unknown twice")

    def _read_pull(self, number: int) -> PullRequest:
        # `get_pull` is lazy: complete it here, so the GET happens inside the classifying wrapper.
        return self._t.read(f"read PR #{number}", lambda: self._t.repo.get_pull(number).complete())

    def merge(self, number: int, approved_sha: str, method: MergeMethod | None) -> MergeResult:
        """Merge PR `number` only at `approved_sha`; see the module docstring for the reconciliation.

        `method` None: the first method the repository allows, preferring merge, then squash, then rebase. The
        merge commit is tried first; if GitHub refuses it as not allowed, the repository's settings are read
        and the next method they allow (or do not show) is tried. A method named by the caller is never
        swapped: its refusal raises `ForgeMergeMethodError`.

        405 "Base branch was modified" (a push to the base during GitHub's merge; nothing changed) is answered
        by reading the PR again and re-sending, `merge_attempts` times in all; after that it stays a
        `ForgeTransientError` for the caller's retry policy. It is never reported as `not_mergeable`.
        """
        config = self._t.config
        chosen: MergeMethod = method or MERGE_METHODS[0]
        refused: list[MergeMethod] = []
        unanswered = 0
        base_moved = 0
        while True:
            pr = self._read_pull(number)
            reconciled = unanswered > 0
            if pr.merged:
                return self._merged_result(pr, approved_sha, reconciled=reconciled, method=chosen)
            try:
                status = self._t.mutate(
                    f"merge PR #{number} at {approved_sha} ({chosen})",
                    partial(pr.merge, sha=approved_sha, merge_method=chosen),
                )
            except ForgeConflictError as exc:
                head = self._head_now(number)
                moved = "head branch was modified" in (exc.github_message or "").lower()
                return MergeResult(
                    status="head_moved" if moved else "not_mergeable",
                    pr_number=number,
                    approved_sha=approved_sha,
                    head_sha=head,
                    message=exc.github_message or str(exc),
                    reconciled=reconciled,
                )
            except ForgeAmbiguousError:
                unanswered += 1
                if unanswered >= 2:
                    raise ForgeAmbiguousError(
                        f"merge of PR #{number}: outcome unknown twice and PR not merged"
                    ) from None
                continue
            except ForgeTransientError as exc:
                if exc.status != 405:
                    raise
                base_moved += 1
                if base_moved >= config.merge_attempts:
                    raise ForgeTransientError(
                        f"merge of PR #{number}: the base branch moved during each of {base_moved} attempts",
                        status=405,
                        github_message=exc.github_message,
                    ) from exc
                time.sleep(config.merge_retry_wait_s * base_moved)
                continue
            except ForgeMergeMethodError as exc:
                refused.append(chosen)
                left = [] if method is not None else self._methods_not_refused(refused)
                if not left:
                    raise ForgeMergeMethodError(
                        f"merge of PR #{number}: {exc.github_message}; refused: {', '.join(refused)}",
                        status=405,
                        github_message=exc.github_message,
                    ) from exc
                chosen = left[0]
                continue
            except ForgePermanentError as exc:
                if exc.status != 405:
                    raise
                after = self._read_pull(number)
                if after.merged:
                    # Merged by our own earlier, unanswered attempt, or by someone else before ours.
                    return self._merged_result(after, approved_sha, reconciled=reconciled, method=chosen)
                return MergeResult(
                    status="not_mergeable",
                    pr_number=number,
                    approved_sha=approved_sha,
                    head_sha=after.head.sha,
                    message=exc.github_message or str(exc),
                    reconciled=reconciled,
                )
            return MergeResult(
                status="merged",
                pr_number=number,
                approved_sha=approved_sha,
                merge_commit_sha=status.sha,
                head_sha=approved_sha,
                message=status.message or "",
                reconciled=reconciled,
                method=chosen,
            )

    def _methods_not_refused(self, refused: list[MergeMethod]) -> list[MergeMethod]:
        """Methods, in order of preference, that GitHub has not refused and the repository's settings do not
        rule out. A setting GitHub leaves out of the answer (it may, for callers without admin rights) does not
        rule its method out. The settings are read conditionally (a 304 when unchanged)."""

        def read() -> list[MergeMethod]:
            self._t.repo.update()
            settings = {
                "merge": self._t.repo.allow_merge_commit,
                "squash": self._t.repo.allow_squash_merge,
                "rebase": self._t.repo.allow_rebase_merge,
            }
            return [m for m in MERGE_METHODS if m not in refused and settings[m] is not False]

        return self._t.read("read the repository's merge settings", read)

    def _head_now(self, number: int) -> str | None:
        try:
            return self._t.read(f"read PR #{number}", lambda: self._t.repo.get_pull(number).head.sha)
        except ForgeError:
            return None

    @staticmethod
    def _merged_result(pr: PullRequest, approved_sha: str, *, reconciled: bool, method: MergeMethod) -> MergeResult:
        """A merged PR: `merged` if our unanswered merge (with `method`) did it, `already_merged` if it was so
        before."""
        at_approved = pr.head.sha == approved_sha
        return MergeResult(
            method=method if reconciled and at_approved else None,
            status=("merged" if reconciled else "already_merged") if at_approved else "merged_at_other_head",
            pr_number=pr.number,
            approved_sha=approved_sha,
            merge_commit_sha=pr.merge_commit_sha,
            head_sha=pr.head.sha,
            reconciled=reconciled,
        )
