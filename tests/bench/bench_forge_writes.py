"""Benchmark: writes and seconds per effectively-once forge object, against the GitHub emulator.

Run: ``uv run python -m tests.bench.bench_forge_writes [--runs N] [--spacing S] [--no-old]``.

Each run makes a fresh object of each kind through `GitHubForge` on unmodified PyGithub, with PyGithub's write
spacing (`seconds_between_writes`, 1 s by default, as GitHub asks of integrations), over real HTTP and git smart
HTTP: a ticket comment on an issue (`ensure_ticket`), a ticket issue (`ensure_ticket` without an issue), a keyed
comment (`ensure_comment`), a branch push (`publish_branch`) and a draft PR (`ensure_draft_pr`). Writes are
counted by the emulator (`tests.support.requests_seen`: POST, PATCH, PUT, DELETE, a push being one POST to
`git-receive-pack`); seconds are wall time of the call, each object on a fresh adapter so no spacing is carried
over from the previous one. Medians over the runs.

The previous claim protocol (a tree, then a commit and a ref write per state change, over the REST git data
API) is measured in the same run when its module can be read from the repository's history
(`OLD_PROTOCOL`); otherwise the figures quoted from the issue are printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from infra.forge.testing import ForgeHandle, running_forge
from reviews.adapter import GitHubForge
from reviews.comments import Comments
from reviews.config import ForgeConfig
from reviews.markers import run_branch_prefix
from reviews.tickets import Tickets
from reviews.transport import Transport
from tests.support.requests_seen import counting
from tests.support.review_site import clone, git

# The last commit whose `reviews/claims.py` has the REST claim protocol (tree, commit and ref per state change).
OLD_PROTOCOL = "85a0e5c"
QUOTED_OLD = {"ticket comment": 7.1, "keyed comment": 8.1}  # seconds, from the demo, as the issue reports them
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Sample:
    writes: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


@dataclass
class Stand:
    """The forge under measurement: ``config`` is what every measured adapter is built from."""

    handle: ForgeHandle
    config: ForgeConfig
    workdir: Path
    issue: int


def _old_claims_module() -> types.ModuleType | None:
    """The previous protocol's `reviews.claims`, loaded from history under another name, or None."""
    shown = subprocess.run(
        ["git", "show", f"{OLD_PROTOCOL}:reviews/claims.py"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if shown.returncode != 0 or "create claim tree" not in shown.stdout:
        return None
    spec = importlib.util.spec_from_loader("reviews_claims_rest_protocol", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    exec(compile(shown.stdout, f"{OLD_PROTOCOL}:reviews/claims.py", "exec"), module.__dict__)
    return module


def _measure(stand: Stand, sample: Sample, call: Callable[[], object]) -> None:
    with counting(stand.handle) as seen:
        started = time.monotonic()
        call()
        elapsed = time.monotonic() - started
    sample.writes.append(seen.writes)
    sample.seconds.append(elapsed)


def _objects(stand: Stand, adapter: Callable[[], Any], run: int, tag: str) -> dict[str, Callable[[], object]]:
    """The effectively-once calls of one run; `adapter()` gives a fresh object with `ensure_ticket`/`_comment`."""
    op = f"bench-{tag}-{run}"
    calls: dict[str, Callable[[], object]] = {}
    first, second, third = adapter(), adapter(), adapter()
    calls["ticket comment"] = lambda: first.ensure_ticket(f"{op}:ticket", stand.issue, "t", "Status: reproducing")
    calls["ticket issue"] = lambda: second.ensure_ticket(f"{op}:tracking", None, f"durafix {op}", "Tracking.")
    calls["keyed comment"] = lambda: third.ensure_comment(stand.issue, f"{op}:evidence", "Evidence bundle")
    return calls


class _OldAdapter:
    """`ensure_ticket` and `ensure_comment` as they were: today's tickets and comments on the old claim store."""

    def __init__(self, config: ForgeConfig, claims_module: types.ModuleType) -> None:
        transport = Transport(config)
        claims = claims_module.ClaimStore(transport, config)
        self._tickets = Tickets(transport, claims)
        self._comments = Comments(transport, claims)

    def ensure_ticket(self, op_id: str, issue_number: int | None, title: str, body: str) -> object:
        return self._tickets.ensure(op_id, issue_number, title, body)

    def ensure_comment(self, number: int, key: str, body: str) -> object:
        return self._comments.ensure(number, key, body)


def _branch_and_pr(stand: Stand, samples: dict[str, Sample], run: int) -> None:
    """A new commit published to a new run branch, then its draft PR: the other effectively-once objects."""
    branch = run_branch_prefix(f"bench-{run}") + "attempt-1"
    git(stand.workdir, "checkout", "-q", "--detach", "main")
    (stand.workdir / "cart.py").write_text(f"total = {run}\n")
    git(stand.workdir, "add", "cart.py")
    git(stand.workdir, "commit", "-q", "-m", f"change {run}")
    sha = git(stand.workdir, "rev-parse", "HEAD")
    pusher, opener = GitHubForge(stand.config), GitHubForge(stand.config)
    _measure(
        stand,
        samples.setdefault("branch push", Sample()),
        lambda: pusher.publish_branch(branch, sha, None, stand.workdir),
    )
    _measure(
        stand,
        samples.setdefault("draft PR", Sample()),
        lambda: opener.ensure_draft_pr(f"bench-{run}", branch, "main", f"Fix {run}", "Body"),
    )


def bench(runs: int, spacing: float, old: bool) -> tuple[dict[str, Sample], dict[str, Sample] | None]:
    with tempfile.TemporaryDirectory(prefix="bench-forge-writes-") as tmp, running_forge(Path(tmp) / "forge") as handle:
        token = handle.create_user("bot")
        full_name = str(handle.create_repo(token, "shop")["full_name"])
        git_url = handle.clone_url(full_name)
        (Path(tmp) / "work").mkdir()
        workdir = clone(git_url, token, Path(tmp) / "work" / "shop")
        config = ForgeConfig(
            api_url=handle.api_url,
            token=SecretStr(token),
            repository=full_name,
            git_url=git_url,
            seconds_between_writes=spacing,
        )
        # Setting up is not measured, so it does not wait between its writes.
        setup = GitHubForge(config.model_copy(update={"seconds_between_writes": 0}))
        issue = setup.create_issue("Cart total is wrong", "Adding two items shows the price of one.")
        stand = Stand(handle, config, workdir, issue)
        new: dict[str, Sample] = {}
        claims_module = _old_claims_module() if old else None
        before: dict[str, Sample] | None = {} if claims_module is not None else None
        for run in range(runs):
            for label, call in _objects(stand, lambda: GitHubForge(stand.config), run, "new").items():
                _measure(stand, new.setdefault(label, Sample()), call)
            if before is not None:
                assert claims_module is not None
                old_adapter = lambda: _OldAdapter(stand.config, claims_module)  # noqa: E731
                for label, call in _objects(stand, old_adapter, run, "old").items():
                    _measure(stand, before.setdefault(label, Sample()), call)
            _branch_and_pr(stand, new, run)
        return new, before


def _row(label: str, sample: Sample) -> str:
    seconds = ", ".join(f"{s:.2f}" for s in sample.seconds)
    return (
        f"  {label + ':':16} {statistics.median(sample.writes):3.0f} writes  "
        f"{statistics.median(sample.seconds):6.2f} s  ({seconds})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Writes and seconds per effectively-once forge object.")
    parser.add_argument("--runs", type=int, default=5, help="objects of each kind (the median is printed)")
    parser.add_argument("--spacing", type=float, default=1.0, help="seconds_between_writes (PyGithub's default 1 s)")
    parser.add_argument("--no-old", action="store_true", help="skip measuring the previous claim protocol")
    args = parser.parse_args()
    print("$ " + shlex.join(["uv", "run", "python", "-m", "tests.bench.bench_forge_writes", *sys.argv[1:]]))
    new, old = bench(args.runs, args.spacing, not args.no_old)
    print(
        f"forge writes per effectively-once object: emulator over HTTP, {args.spacing:g} s between writes, "
        f"median of {args.runs} runs"
    )
    print("claims pushed over git (claim, object, record):")
    for label, sample in new.items():
        print(_row(label, sample))
    if old is not None:
        print(f"previous protocol (REST git data claims, {OLD_PROTOCOL}), same run:")
        for label, sample in old.items():
            print(_row(label, sample))
        for label in old:
            ratio = statistics.median(old[label].seconds) / statistics.median(new[label].seconds)
            print(f"  {label}: previous protocol's seconds / now: {ratio:.1f}x")
    else:
        quoted = ", ".join(f"{label} {seconds} s" for label, seconds in QUOTED_OLD.items())
        print(f"previous protocol not measured here; the issue quotes the demo's {quoted}")


if __name__ == "__main__":
    main()
