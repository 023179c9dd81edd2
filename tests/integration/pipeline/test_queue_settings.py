"""Per-queue worker settings: ``DURAFIX_QUEUE_SETTINGS`` parsed and validated when a worker is built, the
defaults and the command's overrides, and the Temporal workers ``build_workers`` makes carrying them (built
against the real Temporal dev server, inspected through ``Worker.config()``)."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import pytest
from temporalio.client import Client

from pipeline.config import DurafixConfig, SettingsError, load_config
from pipeline.steps import TaskQueue
from pipeline.worker.queue_settings import (
    DEFAULT_MAX_CONCURRENT_ACTIVITIES,
    Overrides,
    WorkerLimits,
    parse_queue_settings,
    worker_limits,
)
from pipeline.worker.runner import activity_threads, build_workers


def config_with(tmp_path: Path, settings: object, **extra: object) -> DurafixConfig:
    return DurafixConfig.model_validate({"state_dir": tmp_path, "queue_settings": settings, **extra})


def test_the_variable_is_read_and_each_queue_gets_its_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    value = {
        "model": {"max_concurrent": 3, "rate_per_s": 0.5},
        "orchestration": {"max_concurrent": 40, "sticky_cache": 7},
    }
    monkeypatch.setenv("DURAFIX_QUEUE_SETTINGS", json.dumps(value))
    config = load_config(tmp_path)
    assert worker_limits(config, TaskQueue.MODEL) == WorkerLimits(max_concurrent=3, rate_per_s=0.5, sticky_cache=None)
    assert worker_limits(config, TaskQueue.ORCHESTRATION) == WorkerLimits(40, None, 7)
    # A queue not named keeps today's defaults.
    assert worker_limits(config, TaskQueue.FORGE) == WorkerLimits(DEFAULT_MAX_CONCURRENT_ACTIVITIES, None, None)


def test_defaults_the_sticky_cache_to_max_cached_workflows(tmp_path: Path) -> None:
    config = config_with(tmp_path, "", max_cached_workflows=0)
    assert worker_limits(config, TaskQueue.ORCHESTRATION) == WorkerLimits(None, None, 0)
    assert worker_limits(config_with(tmp_path, {}), TaskQueue.ORCHESTRATION).sticky_cache == 1000


def test_the_commands_flags_override_the_setting_for_every_queue(tmp_path: Path) -> None:
    config = config_with(tmp_path, {"forge": {"max_concurrent": 2, "rate_per_s": 5}})
    overrides = Overrides(max_concurrent=12, rate_per_s=1.5)
    assert worker_limits(config, TaskQueue.FORGE, overrides) == WorkerLimits(12, 1.5, None)
    # The orchestration worker runs no activities: only the concurrency applies to it.
    assert worker_limits(config, TaskQueue.ORCHESTRATION, overrides) == WorkerLimits(12, None, 1000)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"modle": {"max_concurrent": 2}}, "unknown queue 'modle'; queues: orchestration, forge"),
        ({"model": {"max_concurrent": 0}}, "DURAFIX_QUEUE_SETTINGS['model'] is not valid: max_concurrent"),
        ({"forge": {"rate_per_s": -1}}, "rate_per_s: Input should be greater than 0"),
        ({"model": {"max_concurent": 2}}, "max_concurent: Extra inputs are not permitted"),
        ({"browser": {"sticky_cache": 10}}, "sticky_cache applies to the orchestration queue only"),
        ({"orchestration": {"rate_per_s": 3}}, "the orchestration queue runs none"),
        ({"orchestration": {"max_concurrent": 1}}, "needs max_concurrent 2 or more while its sticky cache is on"),
        ("{not json", "DURAFIX_QUEUE_SETTINGS is not JSON"),
        ("[1, 2]", "must be a JSON object from queue name to settings, not list"),
    ],
)
def test_refuses_what_cannot_be_used_naming_the_setting(tmp_path: Path, value: object, says: str) -> None:
    config = config_with(tmp_path, value if isinstance(value, str) else json.dumps(value))
    with pytest.raises(SettingsError) as caught:
        for queue in TaskQueue:
            worker_limits(config, queue)
    assert says in str(caught.value)


def test_a_bad_value_does_not_stop_the_configuration_from_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only `durafix worker` uses it: every other command still runs.
    monkeypatch.setenv("DURAFIX_QUEUE_SETTINGS", '{"nope": {}}')
    config = load_config(tmp_path)
    with pytest.raises(SettingsError, match="unknown queue 'nope'"):
        parse_queue_settings(config.queue_settings)


def test_a_single_workflow_task_is_allowed_without_the_sticky_cache(tmp_path: Path) -> None:
    config = config_with(tmp_path, {"orchestration": {"max_concurrent": 1, "sticky_cache": 0}})
    assert worker_limits(config, TaskQueue.ORCHESTRATION) == WorkerLimits(1, None, 0)


def test_the_activity_threads_cover_every_queues_limit(tmp_path: Path) -> None:
    config = config_with(tmp_path, {"model": {"max_concurrent": 20}, "forge": {"max_concurrent": 10}})
    assert activity_threads(config, [TaskQueue.ORCHESTRATION, TaskQueue.MODEL, TaskQueue.FORGE]) == 30
    assert activity_threads(config_with(tmp_path, ""), [TaskQueue.FORGE]) == 16


async def own_client(client: Client) -> Client:
    return await Client.connect(client.service_client.config.target_host, namespace=client.namespace)


async def test_the_temporal_workers_carry_the_configured_limits(tmp_path: Path, temporal_client: Client) -> None:
    settings = {
        "orchestration": {"max_concurrent": 25, "sticky_cache": 30},
        "model": {"max_concurrent": 3, "rate_per_s": 0.5},
        "forge": {"rate_per_s": 4},
    }
    config = config_with(tmp_path, json.dumps(settings))
    queues = [TaskQueue.ORCHESTRATION, TaskQueue.MODEL, TaskQueue.FORGE, TaskQueue.ENVIRONMENTS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as executor:
        # A client of their own each: the SDK registers a client's workers, one per queue, and these never run.
        workers = build_workers(await own_client(temporal_client), config, queues, executor)
        overridden = build_workers(
            await own_client(temporal_client),
            config,
            [TaskQueue.MODEL],
            executor,
            overrides=Overrides(max_concurrent=9, rate_per_s=2),
        )
    by_queue = {w.task_queue: w.config() for w in workers}
    orchestration = by_queue[TaskQueue.ORCHESTRATION.value]
    assert orchestration.get("max_concurrent_workflow_tasks") == 25
    assert orchestration.get("max_cached_workflows") == 30
    model = by_queue[TaskQueue.MODEL.value]
    assert (model.get("max_concurrent_activities"), model.get("max_activities_per_second")) == (3, 0.5)
    forge = by_queue[TaskQueue.FORGE.value]
    assert (forge.get("max_concurrent_activities"), forge.get("max_activities_per_second")) == (8, 4)
    environments = by_queue[TaskQueue.ENVIRONMENTS.value]
    assert (environments.get("max_concurrent_activities"), environments.get("max_activities_per_second")) == (8, None)
    flags = overridden[0].config()
    assert (flags.get("max_concurrent_activities"), flags.get("max_activities_per_second")) == (9, 2)
