"""Claim refs: making "create exactly once" safe where GitHub has no idempotency key.

GitHub cannot deduplicate issue or comment creation. Before creating such an object, an attempt claims
the ref `refs/durafix/claims/<kind>/<name>`:

- The ref points to a commit object (git data API) whose message records the claim: the logical name,
  the holding attempt, a state (`claimed`, `creating`, `released`, `done`), the target and, once done,
  the result (e.g. `comment:123`).
- Acquiring is a conditional write: create-ref, which GitHub refuses with 422 "Reference already exists"
  when another attempt got there first.
- Every later change is a compare-and-swap: a new commit whose parent is the commit last observed, and
  a non-force PATCH of the ref, which GitHub refuses ("Update is not a fast forward") if anyone moved the
  ref since. A successor may take over a claim only when it is `released` or its holder has been silent
  for the lease (measured on GitHub's clock: commit date vs. the `Date` of the answer reading it).
- Right before creating, the holder fences: it swaps its claim to `creating`. A stale attempt that lost
  its claim fails that swap and never creates. It also creates only within half a lease of fencing, and
  the lease exceeds twice the request timeout, so a create in flight ends before anyone may take over.
- After the create, the holder records `done` with the result; after a definite failure, `released`.
  After an ambiguous create it first reads GitHub (`find`); if the object is not visible the claim stays
  `creating`, and a successor (after the lease) reads again before taking over.

The claim's commits are unreachable from branches and invisible in the UI; they cost one tree, one
commit per state change and one ref per claimed name.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Literal, TypeVar

from github import InputGitTreeElement
from github.GitCommit import GitCommit
from github.GitTree import GitTree

from reviews.config import ForgeConfig
from reviews.errors import ForgeAmbiguousError, ForgeConflictError, ForgeError, ForgeTransientError
from reviews.markers import ref_component, ref_prefix
from reviews.transport import Transport

T = TypeVar("T")
ClaimStatus = Literal["claimed", "creating", "released", "done"]

log = logging.getLogger(__name__)

_HEADER = "durafix claim"
_FIELDS = ("name", "attempt", "state", "target", "result", "since")


class ClaimLostError(ForgeConflictError):
    """This attempt no longer holds the claim: another attempt moved the ref, or the fence expired."""


@dataclass(frozen=True)
class ClaimRecord:
    name: str
    attempt: str
    state: ClaimStatus
    target: str
    result: str = ""
    since: str = ""

    def message(self) -> str:
        lines = [f"{field}: {getattr(self, field)}" for field in _FIELDS]
        return "\n".join([_HEADER, "", *lines, ""])

    @classmethod
    def parse(cls, message: str) -> ClaimRecord | None:
        """The record in a claim commit's message, or None if the message is not one."""
        lines = message.splitlines()
        if not lines or lines[0].strip() != _HEADER:
            return None
        values: dict[str, str] = {}
        for line in lines[1:]:
            key, sep, value = line.partition(":")
            if sep and key.strip() in _FIELDS:
                values[key.strip()] = value.strip()
        state = values.get("state", "")
        if "name" not in values or "attempt" not in values or state not in ("claimed", "creating", "released", "done"):
            return None
        return cls(
            name=values["name"],
            attempt=values["attempt"],
            state=state,  # type: ignore[arg-type]
            target=values.get("target", ""),
            result=values.get("result", ""),
            since=values.get("since", ""),
        )


@dataclass(frozen=True)
class ClaimState:
    """A claim as last seen (or last written) by this process.

    `age_s` is how long the claim had been in this state on GitHub's clock when observed;
    `fenced_at` is this process's monotonic time of the swap it wrote, if it wrote this state.
    """

    kind: str
    ref: str
    commit: GitCommit
    record: ClaimRecord
    age_s: float
    fenced_at: float | None = None

    @property
    def sha(self) -> str:
        return self.commit.sha

    @property
    def since(self) -> datetime:
        """When the claim was first taken (GitHub's clock): objects created under it are no older."""
        if self.record.since:
            return datetime.fromisoformat(self.record.since)
        return _aware(self.commit.committer.date)


def new_attempt_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _server_age_s(commit: GitCommit) -> float:
    committed = _aware(commit.committer.date)
    date_header = commit.raw_headers.get("date")
    now = parsedate_to_datetime(str(date_header)) if date_header else datetime.now(UTC)
    return max(0.0, (now - committed).total_seconds())


class ClaimStore:
    """Reads and compare-and-swaps claim refs in one repository."""

    def __init__(self, transport: Transport, config: ForgeConfig) -> None:
        self._t = transport
        self._config = config

    @staticmethod
    def ref_path(kind: str, name: str) -> str:
        """Ref path without the leading `refs/`, as PyGithub's get_git_ref expects it."""
        return f"durafix/claims/{kind}/{ref_component(name)}"

    def observe(self, kind: str, name: str) -> ClaimState | None:
        """The claim for `name` as GitHub has it now, or None if nobody ever claimed it."""
        path = self.ref_path(kind, name)
        sha = self._t.read_if_found(f"read claim {path}", lambda: self._t.repo.get_git_ref(path).object.sha)
        if sha is None:
            return None

        def read() -> tuple[GitCommit, ClaimRecord]:
            commit = self._t.repo.get_git_commit(sha)
            record = ClaimRecord.parse(commit.message)
            if record is None or record.name != name:
                raise ForgeConflictError(f"refs/{path} at {sha} is not a claim for {name!r}")
            return commit, record

        commit, record = self._t.read(f"read claim {path}", read)
        return ClaimState(kind, path, commit, record, _server_age_s(commit))

    def create(self, kind: str, record: ClaimRecord) -> ClaimState | None:
        """Take a never-claimed name. None if another attempt created the ref first."""
        path = self.ref_path(kind, record.name)
        tree = self._harmless_write(
            "create claim tree",
            lambda: self._t.repo.create_git_tree([InputGitTreeElement("claim", "100644", "blob", content=path)]),
        )
        commit = self._commit(tree, record, parents=[])
        try:
            self._t.mutate(f"create claim ref {path}", lambda: self._t.repo.create_git_ref(f"refs/{path}", commit.sha))
        except ForgeConflictError:
            return None
        except ForgeAmbiguousError:
            # create-ref is conditional: whatever landed is settled by reading who holds the ref now.
            seen = self.observe(kind, record.name)
            if seen is None or seen.sha != commit.sha:
                return None
        return ClaimState(kind, path, commit, record, 0.0, fenced_at=time.monotonic())

    def advance(self, current: ClaimState, record: ClaimRecord) -> ClaimState | None:
        """Compare-and-swap the claim from `current` to `record`. None if the ref moved since `current`."""
        record = replace(record, since=record.since or current.since.isoformat())
        commit = self._commit(current.commit.tree, record, parents=[current.commit])
        # PATCH goes to the `url` GitHub reports for the ref (`…/git/refs/…`); PyGithub's lazy ref built
        # from `get_git_ref` points at the read-only `…/git/ref/…` spelling, so read it first.
        ref = self._t.read(f"read claim {current.ref}", lambda: self._t.repo.get_git_ref(current.ref).complete())
        try:
            self._t.mutate(f"swap claim {current.ref}", lambda: ref.edit(commit.sha, force=False))
        except ForgeConflictError:
            return None
        except ForgeAmbiguousError:
            # A non-force PATCH to a child of what we saw either landed or was refused; read which.
            seen = self.observe(current.kind, record.name)
            if seen is None or seen.sha != commit.sha:
                return None
        return ClaimState(current.kind, current.ref, commit, record, 0.0, fenced_at=time.monotonic())

    def _commit(self, tree: GitTree, record: ClaimRecord, parents: list[GitCommit]) -> GitCommit:
        return self._harmless_write(
            "create claim commit",
            lambda: self._t.repo.create_git_commit(record.message(), tree, parents),
        )

    def _harmless_write(self, what: str, fn: Callable[[], T]) -> T:
        """Creating an unreferenced git object twice is harmless, so an unknown outcome is simply re-sent."""
        try:
            return self._t.mutate(what, fn)
        except ForgeAmbiguousError:
            return self._t.mutate(what, fn)

    def create_once(
        self,
        kind: str,
        name: str,
        target: str,
        find: Callable[[ClaimState | None], T | None],
        create: Callable[[], T],
        result_of: Callable[[T], str],
    ) -> T:
        """Return the object `find` sees for `name`, creating it with `create` at most once across attempts.

        `find(claim)` reads GitHub's truth (it gets the current claim, for targets that need its record).
        Waits up to `claim_wait_s` for another live holder to finish; then raises `ForgeTransientError`
        with the time left on that holder's lease. A claim recorded `done` whose object `find` no longer
        sees (deleted by a person) raises `ForgeConflictError` instead of creating a second one.
        """
        attempt = new_attempt_id()
        deadline = time.monotonic() + self._config.claim_wait_s
        pause = self._config.claim_poll_s
        while True:
            seen = self.observe(kind, name)
            found = find(seen)
            if found is not None:
                return found
            if seen is not None and seen.record.state == "done":
                raise ForgeConflictError(f"claim {name!r} records {seen.record.result!r}, which no longer exists")
            held = self._acquire(kind, name, target, seen, attempt)
            if held is not None:
                try:
                    return self.create_under(held, find, create, result_of)
                except ClaimLostError:
                    log.info("claim %s lost or expired before creating; re-reading", name)
            elif seen is not None and time.monotonic() >= deadline:
                # (seen is None here only when another attempt won the create race a moment ago.)
                left = max(0.0, self._config.claim_lease_s - seen.age_s)
                raise ForgeTransientError(
                    f"claim {name!r} held by {seen.record.attempt} ({seen.record.state}); lease ends in {left:.0f}s",
                    retry_after_s=left,
                )
            time.sleep(pause)
            pause = min(pause * 2, 5.0)

    def _acquire(self, kind: str, name: str, target: str, seen: ClaimState | None, attempt: str) -> ClaimState | None:
        if seen is None:
            return self.create(kind, ClaimRecord(name=name, attempt=attempt, state="claimed", target=target))
        if seen.record.attempt == attempt:
            return seen
        if seen.record.state == "released" or seen.age_s >= self._config.claim_lease_s:
            # `find` has just read GitHub and seen nothing, and the holder's create (if any) is over.
            record = replace(seen.record, attempt=attempt, state="claimed", result="")
            return self.advance(seen, record)
        return None

    def create_under(
        self,
        held: ClaimState,
        find: Callable[[ClaimState | None], T | None],
        create: Callable[[], T],
        result_of: Callable[[T], str],
    ) -> T:
        """Create while holding `held`; raises `ClaimLostError` without creating if the claim was lost."""
        fenced = self.advance(held, replace(held.record, state="creating"))
        if fenced is None:
            raise ClaimLostError(f"claim {held.record.name!r} was taken over")
        found = find(fenced)
        if found is not None:
            self._finish(fenced, "done", result_of(found))
            return found
        assert fenced.fenced_at is not None
        if time.monotonic() - fenced.fenced_at > self._config.claim_lease_s / 2:
            raise ClaimLostError(f"claim {held.record.name!r}: fence too old to create under")
        try:
            created = create()
        except ForgeAmbiguousError:
            found = find(fenced)
            if found is None:
                raise
            created = found
        except ForgeError:
            # The create was answered (or never sent): nothing will land later, successors need not wait.
            self._finish(fenced, "released", "")
            raise
        self._finish(fenced, "done", result_of(created))
        return created

    def _finish(self, fenced: ClaimState, state: ClaimStatus, result: str) -> None:
        """Record the outcome. Best effort: the created object itself is the truth `find` reads."""
        try:
            if self.advance(fenced, replace(fenced.record, state=state, result=result)) is None:
                log.warning("claim %s moved before recording %s", fenced.record.name, state)
        except ForgeError as exc:
            log.warning("could not record claim %s as %s: %s", fenced.record.name, state, exc)

    def list_claims(self, kind: str, name_prefix: str) -> list[ClaimState]:
        """Claims of `kind` whose recorded name starts with `name_prefix`."""
        prefix = f"durafix/claims/{kind}/{ref_prefix(name_prefix)}"

        def read() -> list[ClaimState]:
            states: list[ClaimState] = []
            for ref in self._t.repo.get_git_matching_refs(prefix):
                commit = self._t.repo.get_git_commit(ref.object.sha)
                record = ClaimRecord.parse(commit.message)
                if record is not None and record.name.startswith(name_prefix):
                    path = ref.ref.removeprefix("refs/")
                    states.append(ClaimState(kind, path, commit, record, _server_age_s(commit)))
            return states

        # An empty repository has no refs, so no claims.
        return self._t.read_if_found(f"list claims {prefix}", read) or []
