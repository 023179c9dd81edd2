"""What a run's model tokens cost, from the operator's optional price table.

The table maps a model name (as the endpoint's answers name it, :attr:`pipeline.state.Budgets.model`) to
its prices per million prompt and completion tokens: ``{"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}}``
(the ``DURAFIX_MODEL_PRICES`` setting, :mod:`pipeline.config`). Without a table, or without a price for
the run's model, the cost is unknown and said to be: it is never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # annotations only: the config reads this module, and needs none of the run's state
    from pipeline.state import Budgets

PRICES_SETTING = "DURAFIX_MODEL_PRICES"


class ModelPrice(BaseModel):
    """Prices of one model per million tokens, in the table's currency."""

    model_config = ConfigDict(extra="forbid")

    prompt: float = Field(ge=0)
    completion: float = Field(ge=0)

    def of(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1_000_000


class RunCost(BaseModel):
    """The run's cost and each attempt's (by attempt number), or ``None`` with ``unknown`` saying why."""

    run: float | None = None
    attempts: dict[int, float] = Field(default_factory=dict)
    unknown: str = ""


def run_cost(budgets: Budgets, prices: Mapping[str, ModelPrice] | None) -> RunCost:
    """The run's tokens (every model call, drafting and failed calls included) and each attempt's, priced at
    the model the answers named. Unknown without a table, or without an entry for that model."""
    if not prices:
        return RunCost(unknown=f"no price table ({PRICES_SETTING})")
    if budgets.model_tokens == 0:
        return RunCost(run=0.0)
    price = prices.get(budgets.model)
    if price is None:
        named = budgets.model or "(no answer has named one yet)"
        return RunCost(unknown=f"no price for model {named} in the price table")
    return RunCost(
        run=price.of(budgets.model_prompt_tokens, budgets.model_completion_tokens),
        attempts={
            u.attempt: prices.get(u.model or budgets.model, price).of(u.prompt_tokens, u.completion_tokens)
            for u in budgets.attempts
        },
    )


def money(amount: float) -> str:
    """``0.0123``: four decimals (a run's cost is usually cents), more for a smaller non-zero amount."""
    if 0 < amount < 0.0001:
        return f"{amount:.2g}"
    return f"{amount:.4f}"
