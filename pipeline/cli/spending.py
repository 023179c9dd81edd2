"""What ``durafix status`` says of a run's budgets: attempts, tokens per run, attempt and call, the counts
kept apart (transport retries, refusals, no-op patches, invalid tool calls), and the cost when a price
table gives one (:mod:`pipeline.pricing`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.pricing import ModelPrice, money, run_cost
from pipeline.state import Budgets

# How many of the recorded latest calls the human view lists (``--json`` has them all).
SHOWN_CALLS = 6


def budget_lines(budgets: Budgets, prices: Mapping[str, ModelPrice] | None = None) -> list[str]:
    """The budgets block of the human view, one fact per line, each under a ten-column label."""
    b = budgets
    cost = run_cost(b, prices)
    lines = [
        f"budgets    repair {b.repair_attempts_used}/{b.repair_attempts_max}; "
        f"tokens {b.model_tokens}/{b.model_token_budget} "
        f"({b.model_prompt_tokens} prompt + {b.model_completion_tokens} completion)",
        f"model      {b.model or 'no answer yet'}; transport retries {b.transport_retries}"
        + (f" ({b.outage_waits} outage wait(s), {b.outage_wait_s:g} s)" if b.outage_waits else "")
        + f"; refusals {b.refusals}; no-op patches {b.no_op_patches}; invalid tool calls {b.invalid_tool_calls}",
    ]
    for usage in b.attempts:
        priced = cost.attempts.get(usage.attempt)
        lines.append(
            f"tokens a{usage.attempt:<3} {usage.tokens} ({usage.prompt_tokens} prompt + {usage.completion_tokens} "
            f"completion) over {usage.calls} call(s); transport retries {usage.transport_retries}; "
            f"invalid tool calls {usage.invalid_tool_calls}" + (f"; cost {money(priced)}" if priced is not None else "")
        )
    if b.recent_calls:
        shown = b.recent_calls[-SHOWN_CALLS:]
        calls = ", ".join(
            f"a{c.attempt}/t{c.turn} {c.prompt_tokens}+{c.completion_tokens}"
            + (f" ({c.transport_retries} retried)" if c.transport_retries else "")
            for c in reversed(shown)
        )
        lines.append(f"calls      latest first: {calls}")
    lines.append(f"cost       {money(cost.run)}" if cost.run is not None else f"cost       unknown: {cost.unknown}")
    return lines


def cost_json(budgets: Budgets, prices: Mapping[str, ModelPrice] | None = None) -> dict[str, Any]:
    """The cost for ``--json``: ``{"run": float | null, "attempts": {"1": float}, "unknown": reason}``."""
    return run_cost(budgets, prices).model_dump(mode="json")
