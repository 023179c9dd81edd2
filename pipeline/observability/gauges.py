"""Gauges read when scraped: the open runs by phase (Temporal's visibility) and what runs own on this host.

Both are snapshots of state that lives elsewhere, so a worker restart loses nothing: they are read again, at
most every :data:`TTL_S` (a scrape every few seconds does not list every run each time); the open runs in the
background once the process is first scraped, so a scrape never waits for Temporal.

- ``durafix_runs_open{phase}``: running ``repair_bug`` runs by the phase they last recorded in their memo
  (:mod:`pipeline.recorded_state`; ``unknown`` for a run that recorded none);
  ``durafix_run_phase_age_max_seconds{phase}``: how long the oldest of them has been in that phase;
  ``durafix_runs_awaiting_review`` and ``durafix_review_wait_max_seconds``: the runs parked waiting for a review
  (phase ``awaiting-review``) and the longest wait. Served by workers of the orchestration queue; at most
  :data:`MAX_RUNS` runs are read per snapshot (``durafix_runs_open_truncated`` says when there were more).
- ``durafix_owned_resources{kind, provider}``: processes, containers, networks, volumes and workspaces runs
  own on this worker's providers (the inventory ``durafix resources`` prints);
  ``durafix_owned_resources_unavailable``: providers that could not be listed. Served by workers of the
  environments queue.

A snapshot that fails (Temporal unreachable) yields no sample: the series go absent, which alerts can see.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, TypeVar

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from temporalio.client import Client

from environments.inventory import open_holders, take_inventory
from pipeline.config import DurafixConfig
from pipeline.ops.reconciler import OPEN_RUNS
from pipeline.recorded_state import STATE_MEMO, parse_recorded
from pipeline.state import Phase

log = logging.getLogger(__name__)

TTL_S = 15.0
MAX_RUNS = 5000
LIST_TIMEOUT_S = 20.0
STALE_S = 4 * TTL_S
UNKNOWN_PHASE = "unknown"
T = TypeVar("T")


class Cached(Generic[T]):
    """``read()``'s value, read again once it is older than ``ttl_s``; a failed read is ``None`` (and retried
    at the next call)."""

    def __init__(self, read: Callable[[], T], ttl_s: float = TTL_S) -> None:
        self.read = read
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._value: T | None = None
        self._at = 0.0
        self._failing = False

    def get(self) -> T | None:
        with self._lock:
            if self._value is not None and time.monotonic() - self._at < self.ttl_s:
                return self._value
            try:
                self._value = self.read()
            except Exception as err:  # a snapshot that cannot be taken is an absent series, not a failed scrape
                if not self._failing:  # once when the failures start, not at every scrape
                    log.warning("a gauge snapshot failed; its series are absent until one succeeds: %r", err)
                self._failing = True
                self._value = None
            else:
                self._failing = False
            self._at = time.monotonic()
            return self._value


@dataclass
class OpenRunsSnapshot:
    count: Counter[str] = field(default_factory=Counter)
    oldest_s: dict[str, float] = field(default_factory=dict)
    truncated: bool = False


async def open_runs(client: Client, now: datetime) -> OpenRunsSnapshot:
    """The running ``repair_bug`` runs by recorded phase, and the age of the oldest in each."""
    snap = OpenRunsSnapshot()
    seen = 0
    async for wf in client.list_workflows(OPEN_RUNS, limit=MAX_RUNS + 1):
        seen += 1
        if seen > MAX_RUNS:
            snap.truncated = True
            break
        recorded = parse_recorded((await wf.memo()).get(STATE_MEMO))
        phase = recorded.phase if recorded is not None else UNKNOWN_PHASE
        since = recorded.at if recorded is not None else wf.start_time
        age = max(0.0, (now - since).total_seconds())
        snap.count[phase] += 1
        snap.oldest_s[phase] = max(age, snap.oldest_s.get(phase, 0.0))
    return snap


def open_runs_families(snap: OpenRunsSnapshot) -> list[Metric]:
    """The open-runs gauges of ``snap``."""
    runs = GaugeMetricFamily("durafix_runs_open", "Running runs by the phase they last recorded", labels=["phase"])
    oldest = GaugeMetricFamily(
        "durafix_run_phase_age_max_seconds", "How long the oldest open run has been in its phase", labels=["phase"]
    )
    for phase in sorted(snap.count):
        runs.add_metric([phase], snap.count[phase])
        oldest.add_metric([phase], snap.oldest_s[phase])
    review = Phase.AWAITING_REVIEW.value
    parked = GaugeMetricFamily(
        "durafix_runs_awaiting_review", "Open runs parked waiting for a review", value=snap.count[review]
    )
    waited = GaugeMetricFamily(
        "durafix_review_wait_max_seconds",
        "The longest review wait among open runs (0 when none waits)",
        value=snap.oldest_s.get(review, 0.0),
    )
    truncated = GaugeMetricFamily(
        "durafix_runs_open_truncated",
        f"1 when more than {MAX_RUNS} runs were open and the rest not read",
        value=float(snap.truncated),
    )
    return [runs, oldest, parked, waited, truncated]


class OpenRuns(Collector):
    """The open-runs gauges (see the module), listed through ``client`` every :data:`TTL_S` by a task on the
    worker's event loop ``loop``, started by the first scrape (a warm spare nobody scrapes lists nothing): a
    scrape never waits for Temporal's visibility. A snapshot older than :data:`STALE_S` (the listing keeps
    failing) is not served."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.latest: tuple[float, OpenRunsSnapshot] | None = None
        self._refreshing: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()

    async def refresh_forever(self) -> None:
        """List the open runs every :data:`TTL_S`. A listing that fails is logged once when the failures start
        and once when they end (not every 15 s): an on-call engineer reading the log of a worker whose
        ``durafix_runs_open`` went absent finds why."""
        failing = False
        while True:
            try:
                snap = await asyncio.wait_for(open_runs(self.client, datetime.now(UTC)), LIST_TIMEOUT_S)
                self.latest = (time.monotonic(), snap)
                if failing:
                    log.info("listing the open runs works again; durafix_runs_open is served")
                failing = False
            except Exception as err:  # Temporal unreachable: the snapshot goes stale, its series absent
                if not failing:
                    log.warning(
                        "listing the open runs failed (%s: %s); durafix_runs_open goes absent after %.0f s "
                        "unless a listing succeeds",
                        type(err).__name__,
                        err,
                        STALE_S,
                    )
                failing = True
            await asyncio.sleep(TTL_S)

    def stop(self) -> None:
        with self._lock:
            if self._refreshing is not None:
                self._refreshing.cancel()

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            if self._refreshing is None and not self.loop.is_closed():
                self._refreshing = asyncio.run_coroutine_threadsafe(self.refresh_forever(), self.loop)
        latest = self.latest
        if latest is None or time.monotonic() - latest[0] > STALE_S:
            return []
        return open_runs_families(latest[1])


@dataclass
class OwnedSnapshot:
    count: Counter[tuple[str, str]]
    unavailable: int


def owned_families(snap: OwnedSnapshot) -> list[Metric]:
    """The owned-resources gauges of ``snap``."""
    owned = GaugeMetricFamily(
        "durafix_owned_resources", "Resources runs own on this worker's providers", labels=["kind", "provider"]
    )
    for (kind, provider), n in sorted(snap.count.items()):
        owned.add_metric([kind, provider], n)
    unavailable = GaugeMetricFamily(
        "durafix_owned_resources_unavailable",
        "Providers whose resources could not be listed",
        value=snap.unavailable,
    )
    return [owned, unavailable]


class OwnedResources(Collector):
    """The owned-resources gauges of the providers a worker with ``config`` uses (see the module)."""

    def __init__(self, config: DurafixConfig) -> None:
        self.config = config
        self.cache = Cached(self._read)

    def _read(self) -> OwnedSnapshot:
        holders, unopened = open_holders(
            self.config.state_dir,
            environment_provider=self.config.environment_provider,
            docker_host=self.config.docker_host,
        )
        inventory = take_inventory(holders, unopened)
        count = Counter((r.kind.value, r.provider) for r in inventory.resources)
        return OwnedSnapshot(count=count, unavailable=len(inventory.unavailable))

    def collect(self) -> Iterable[Metric]:
        snap = self.cache.get()
        return [] if snap is None else owned_families(snap)
