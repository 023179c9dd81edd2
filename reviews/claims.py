"""Claim refs: making "create exactly once" safe where GitHub has no idempotency key.

GitHub cannot deduplicate issue or comment creation. Before creating such an object, an attempt claims
the ref `refs/durafix/claims/<kind>/<name>`:

- The ref points to a commit whose message records the claim: the logical name, the holding attempt, a
  state (`creating`, `released`, `done`), the target, the time the name was first claimed and, once done,
  the result (e.g. `comment:123`). The commit has git's empty tree and no parent.
- Every claim write is one `git push` over smart HTTP (one POST to `git-receive-pack`, the only write
  request it sends) carrying the new commit and the ref update together, with
  `--force-with-lease=<ref>:<expected>`: git sends the ref's old value in the update command and
  receive-pack applies it as a compare-and-swap under the ref's lock, refusing ("stale info" from the
  client, or a remote rejection) when the ref is not where the writer last saw it. An empty expected value
  means "must not exist", so exactly one attempt acquires a never-claimed name.
- A claim is born `creating`: acquiring is the fence. Nothing takes a claim over until it is `released`
  or its holder has been silent for the lease, measured on GitHub's clock (the claim commit's date vs. the
  `Date` of the answer reading it). The holder sends its create only within half a lease of acquiring (on
  its own monotonic clock, from before the push), and the lease exceeds twice the request timeout, so a
  create in flight is over before anyone may take over. A stale attempt that lost its claim therefore
  never creates: its fence is too old, and it re-reads before acquiring again.
- After the create, the holder records `done` with the result; after a definite failure, `released`.
  After an ambiguous create it reads GitHub (`find`); if the object is not visible the claim stays
  `creating`, and a successor (after the lease) reads again before taking over.

Happy path: three writes per object, each spaced by `seconds_between_writes` (`Transport.write_slot`):
the claim push, the create, the record push. A crash after the claim leaves a `creating` claim that the
next attempt waits out (one lease) before reading again and taking over; a crash after the create leaves
the object, which the next attempt's `find` returns before any claim is touched; the record is best effort.

What it relies on from GitHub: pushes to refs outside `refs/heads/` and `refs/tags/` are accepted over
smart HTTP with the repository's token (`x-access-token`), like any ref update, and such refs are read
through the git refs REST API (`GET /repos/{owner}/{repo}/git/ref/durafix/claims/...`) without showing in
the UI; receive-pack's old-value check (git's own compare-and-swap, used by `--force-with-lease`); a commit
with the empty tree (what `git commit --allow-empty` makes of a first commit) is an ordinary object. The
commit's date is the writer's estimate of GitHub's time (the last `Date` header it read, rounded up, plus
its own elapsed time), so the lease is measured on one clock. An empty repository (no commit pushed yet)
is refused with `ForgeEmptyRepositoryError` before anything is pushed, as the git data API refuses it.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Literal, TypeVar

from github import GithubException

from reviews.branches import _git_env
from reviews.config import ForgeConfig
from reviews.errors import (
    ForgeAmbiguousError,
    ForgeConflictError,
    ForgeEmptyRepositoryError,
    ForgeError,
    ForgeNotFoundError,
    ForgePermanentError,
    ForgeTransientError,
)
from reviews.leased_push import leased_push
from reviews.markers import ref_component, ref_prefix
from reviews.transport import Transport

T = TypeVar("T")
# `claimed` is what earlier versions wrote before fencing; it is read (as a live claim) but never written.
ClaimStatus = Literal["claimed", "creating", "released", "done"]

log = logging.getLogger(__name__)

_HEADER = "durafix claim"
_FIELDS = ("name", "attempt", "state", "target", "result", "since")
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_AUTH_FAILURE = re.compile(r"returned error: (401|403|404)|Authentication failed|could not read Username", re.I)
_NOT_CONNECTED = re.compile(r"Failed to connect|Could not resolve host|Connection refused", re.I)
_IDENTITY = {
    "GIT_AUTHOR_NAME": "durafix",
    "GIT_AUTHOR_EMAIL": "durafix@claims.invalid",
    "GIT_COMMITTER_NAME": "durafix",
    "GIT_COMMITTER_EMAIL": "durafix@claims.invalid",
}


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

    `committed` is the claim commit's date (GitHub's clock, as its writer estimated it); `age_s` is how
    long the claim had been in this state on GitHub's clock when observed; `fenced_at` is this process's
    monotonic time from before the push that wrote this state, if it wrote it.
    """

    kind: str
    ref: str
    sha: str
    record: ClaimRecord
    committed: datetime
    age_s: float
    fenced_at: float | None = None

    @property
    def since(self) -> datetime:
        """When the claim was first taken (GitHub's clock): objects created under it are no older."""
        if self.record.since:
            return datetime.fromisoformat(self.record.since)
        return self.committed


def new_attempt_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _date_header(headers: Mapping[str, object] | None) -> datetime | None:
    value = (headers or {}).get("date")
    if not value:
        return None
    try:
        return _aware(parsedate_to_datetime(str(value)))
    except (TypeError, ValueError):
        return None


class ClaimStore:
    """Reads and compare-and-swaps claim refs in one repository."""

    def __init__(self, transport: Transport, config: ForgeConfig) -> None:
        self._t = transport
        self._config = config
        # GitHub's clock as last read: (Date header, this process's monotonic time when it arrived).
        self._clock: tuple[datetime, float] | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    @staticmethod
    def ref_path(kind: str, name: str) -> str:
        """Ref path without the leading `refs/`, as PyGithub's get_git_ref expects it."""
        return f"durafix/claims/{kind}/{ref_component(name)}"

    def observe(self, kind: str, name: str) -> ClaimState | None:
        """The claim for `name` as GitHub has it now, or None if nobody ever claimed it (or the repository
        is empty, where no ref exists)."""
        try:
            return self._observe(kind, name)
        except ForgeEmptyRepositoryError:
            return None

    def _observe(self, kind: str, name: str) -> ClaimState | None:
        """`observe`, raising `ForgeEmptyRepositoryError` for an empty repository."""
        path = self.ref_path(kind, name)

        def read_ref() -> str | None:
            try:
                ref = self._t.repo.get_git_ref(path)
                sha = ref.object.sha
                self._saw(ref.raw_headers)
                return sha
            except GithubException as exc:
                self._saw(exc.headers)
                raise

        try:
            sha = self._t.read(f"read claim {path}", read_ref)
        except ForgeNotFoundError:
            return None
        if sha is None:
            return None

        def read() -> ClaimState:
            commit = self._t.repo.get_git_commit(sha)
            record = ClaimRecord.parse(commit.message)
            if record is None or record.name != name:
                raise ForgeConflictError(f"refs/{path} at {sha} is not a claim for {name!r}")
            committed = _aware(commit.committer.date)
            answered = self._saw(commit.raw_headers) or datetime.now(UTC)
            age = max(0.0, (answered - committed).total_seconds())
            return ClaimState(kind, path, sha, record, committed, age)

        return self._t.read(f"read claim {path}", read)

    def create(self, kind: str, record: ClaimRecord) -> ClaimState | None:
        """Take a never-claimed name (one push). None if another attempt took it first."""
        return self._push(kind, self.ref_path(kind, record.name), record, expected=None)

    def advance(self, current: ClaimState, record: ClaimRecord) -> ClaimState | None:
        """Compare-and-swap the claim from `current` to `record` (one push). None if the ref moved since."""
        record = replace(record, since=record.since or current.since.isoformat())
        return self._push(current.kind, current.ref, record, expected=current.sha)

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
        sees (deleted by a person) raises `ForgeConflictError` instead of creating a second one. An empty
        repository raises `ForgeEmptyRepositoryError` without writing anything.
        """
        attempt = new_attempt_id()
        deadline = time.monotonic() + self._config.claim_wait_s
        pause = self._config.claim_poll_s
        while True:
            seen = self._observe(kind, name)
            found = find(seen)
            if found is not None:
                return found
            if seen is not None and seen.record.state == "done":
                raise ForgeConflictError(f"claim {name!r} records {seen.record.result!r}, which no longer exists")
            held = self._acquire(kind, name, target, seen, attempt)
            if held is not None:
                if seen is not None and seen.record.attempt != attempt:
                    # Taken over from a released or silent holder: `find` above ran after its create (if
                    # any) was over, and reading once more now costs no write.
                    found = find(held)
                    if found is not None:
                        self._finish(held, "done", result_of(found))
                        return found
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
        """Acquire and fence in one write: the claim is written `creating` by this attempt."""
        if seen is None:
            return self.create(kind, ClaimRecord(name=name, attempt=attempt, state="creating", target=target))
        if seen.record.attempt == attempt:
            # Our own claim whose fence got too old before we created: renew the fence (nothing was sent).
            return self.advance(seen, replace(seen.record, state="creating"))
        if seen.record.state == "released" or seen.age_s >= self._config.claim_lease_s:
            # `find` has just read GitHub and seen nothing, and the holder's create (if any) is over.
            record = replace(seen.record, attempt=attempt, state="creating", result="")
            return self.advance(seen, record)
        return None

    def create_under(
        self,
        held: ClaimState,
        find: Callable[[ClaimState | None], T | None],
        create: Callable[[], T],
        result_of: Callable[[T], str],
    ) -> T:
        """Create while holding `held` (a `creating` claim this process wrote); raises `ClaimLostError`
        without creating if the fence is older than half a lease: from then on a successor may take over."""
        if held.fenced_at is None or held.record.state not in ("creating", "claimed"):
            raise ClaimLostError(f"claim {held.record.name!r} was not fenced by this process")
        if time.monotonic() - held.fenced_at > self._config.claim_lease_s / 2:
            raise ClaimLostError(f"claim {held.record.name!r}: fence too old to create under")
        try:
            created = create()
        except ForgeAmbiguousError:
            found = find(held)
            if found is None:
                raise
            created = found
        except ForgeError:
            # The create was answered (or never sent): nothing will land later, successors need not wait.
            self._finish(held, "released", "")
            raise
        self._finish(held, "done", result_of(created))
        return created

    def _finish(self, held: ClaimState, state: ClaimStatus, result: str) -> None:
        """Record the outcome. Best effort: the created object itself is the truth `find` reads."""
        try:
            if self.advance(held, replace(held.record, state=state, result=result)) is None:
                log.warning("claim %s moved before recording %s", held.record.name, state)
        except ForgeError as exc:
            log.warning("could not record claim %s as %s: %s", held.record.name, state, exc)

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
                    committed = _aware(commit.committer.date)
                    answered = _date_header(commit.raw_headers) or datetime.now(UTC)
                    age = max(0.0, (answered - committed).total_seconds())
                    states.append(ClaimState(kind, path, commit.sha, record, committed, age))
            return states

        # An empty repository has no refs, so no claims.
        return self._t.read_if_found(f"list claims {prefix}", read) or []

    # --- writing a claim: one push -----------------------------------------------------------------------

    def _saw(self, headers: Mapping[str, object] | None) -> datetime | None:
        """Keep GitHub's clock from an answer's `Date` header; returns it."""
        answered = _date_header(headers)
        if answered is not None:
            self._clock = (answered, time.monotonic())
        return answered

    def _github_now(self) -> datetime:
        """An upper bound of GitHub's time now: `Date` has whole seconds, so one is added to the last one
        read, plus what elapsed here since. Erring late makes a claim look younger, never older."""
        if self._clock is None:
            # Only for a write without a read before it (`create_once` always reads the ref first).
            path = f"/repos/{self._config.repository}"
            headers, _ = self._t.read(
                "read GitHub's clock", lambda: self._t.github.requester.requestJsonAndCheck("GET", path)
            )
            self._saw(headers)
        assert self._clock is not None
        answered, at = self._clock
        return answered + timedelta(seconds=1 + time.monotonic() - at)

    def _push(self, kind: str, path: str, record: ClaimRecord, expected: str | None) -> ClaimState | None:
        """Write `record` as the claim at `refs/<path>` if the ref is at `expected` (absent for None).

        Returns the new state when the ref holds it, None when another attempt holds the ref. A push whose
        outcome is unclear is settled by reading the ref (our commit's sha is unique); if the ref is still
        where it was, the push did not land: `ForgeTransientError`.
        """
        fenced_at = time.monotonic()
        moment = self._github_now()
        committed = datetime.fromtimestamp(math.ceil(moment.timestamp()), UTC)
        record = replace(record, since=record.since or committed.isoformat())
        sha = self._commit(record, committed)
        ref = f"refs/{path}"
        with self._t.write_slot():
            failure = self._send(ref, sha, expected)
        state = ClaimState(kind, path, sha, record, committed, 0.0, fenced_at=fenced_at)
        if failure is None:
            return state
        try:
            seen = self._t.read_if_found(f"read claim {path}", lambda: self._t.repo.get_git_ref(path).object.sha)
        except ForgeError as exc:
            raise ForgeAmbiguousError(f"claim push to {ref} failed ({failure}); reading it failed: {exc}") from exc
        if seen == sha:
            return state
        if seen != expected:
            return None
        if "declined" in failure:
            # A pre-receive hook or rule of the repository refuses the ref: retrying cannot change that.
            raise ForgePermanentError(f"claim push to {ref} refused by the forge ({failure})")
        raise ForgeTransientError(f"claim push to {ref} failed ({failure}); the claim is unchanged")

    def _repo_dir(self) -> str:
        """A bare repository to build claim commits in (they are pushed, never kept)."""
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="durafix-claims-")
            self._git(["init", "--bare", "-q", self._scratch.name], cwd=None)
        return self._scratch.name

    def _git(self, args: list[str], cwd: str | None, stdin: str | None = None, **env: str) -> str:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            input=stdin,
            env={**_git_env(self._config, self._t.git_token()), **_IDENTITY, "GIT_CONFIG_NOSYSTEM": "1", **env},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ForgePermanentError(f"git {args[0]} for a claim failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def _commit(self, record: ClaimRecord, committed: datetime) -> str:
        date = f"@{int(committed.timestamp())} +0000"
        return self._git(
            # Never signed, whatever the host's git config asks: nobody verifies a claim's signature.
            ["commit-tree", "--no-gpg-sign", EMPTY_TREE, "-F", "-"],
            cwd=self._repo_dir(),
            stdin=record.message(),
            GIT_AUTHOR_DATE=date,
            GIT_COMMITTER_DATE=date,
        )

    def _send(self, ref: str, sha: str, expected: str | None) -> str | None:
        """One conditional push. None on success; a description when the outcome needs a read of the ref.

        A refused lease is a description too, since reading the ref tells who holds it; authentication
        failures raise `ForgePermanentError`, no connection at all `ForgeTransientError`.
        """
        done = leased_push(
            self._config.git_url,
            sha,
            ref,
            expected,
            cwd=self._repo_dir(),
            env={**_git_env(self._config, self._t.git_token()), "GIT_CONFIG_NOSYSTEM": "1"},
            # A claim push is one small request: bounded like any other request, so the fence's
            # half-lease budget is not spent waiting on it.
            timeout_s=self._config.request_timeout_s,
        )
        if done is None:
            return f"git push timed out after {self._config.request_timeout_s}s"
        if done.pushed:
            return None
        if done.rejection is not None:
            return f"push rejected: {done.rejection}"
        return done.failure(f"claim push to {ref}")
