"""How the run counts what its model steps spent, and how long it waits out a model endpoint's outage.

The workflow hands these functions its :class:`~pipeline.state.Budgets` with a step's result or failure:
tokens per call (the last :data:`~pipeline.state.RECENT_CALLS` turns), per attempt and per run; transport
retries; refusals, no-op patches and invalid tool calls, each counted apart. Pure and deterministic (no
clock, no I/O), so they run inside the workflow.

A transport failure (a step's every try failed ``Transient``: 429, 5xx, a timeout of the model request) is
the endpoint's outage, never the attempt's verdict: the workflow waits :func:`outage_wait` on a durable
timer and sends the same step again, until one outage has lasted the run policy's
``model_outage_allowance_s`` (:func:`outage_spent`).
"""

from __future__ import annotations

from pipeline.failures import NO_OP, NO_PATCH_KIND, FailureClass, failure_class, failure_details
from pipeline.policies import RunPolicy
from pipeline.state import RECENT_CALLS, Budgets, ModelCall
from pipeline.steps import AgentToolsResult, AgentTurnResult, ProposalResult


def _charge(budgets: Budgets, attempt: int | None, prompt: int, completion: int, transport: int) -> None:
    """Tokens and transport retries to the run, and to ``attempt`` when one is named."""
    budgets.model_prompt_tokens += prompt
    budgets.model_completion_tokens += completion
    budgets.transport_retries += transport
    if attempt is not None:
        usage = budgets.attempt_usage(attempt)
        usage.prompt_tokens += prompt
        usage.completion_tokens += completion
        usage.transport_retries += transport


def charge_turn(budgets: Budgets, attempt: int, turn: int, answer: AgentTurnResult) -> None:
    """A model turn's answer: its tokens to the run and the attempt, its transport retries, the call kept."""
    _charge(budgets, attempt, answer.prompt_tokens, answer.completion_tokens, answer.transport_retries)
    budgets.model = answer.model or budgets.model
    usage = budgets.attempt_usage(attempt)
    usage.model = answer.model or usage.model
    usage.calls += 1
    budgets.recent_calls.append(
        ModelCall(
            attempt=attempt,
            turn=turn,
            model=answer.model,
            prompt_tokens=answer.prompt_tokens,
            completion_tokens=answer.completion_tokens,
            transport_retries=answer.transport_retries,
        )
    )
    del budgets.recent_calls[:-RECENT_CALLS]


def count_tools(budgets: Budgets, attempt: int, ran: AgentToolsResult) -> None:
    """A tool batch: the calls it answered ``error: ...``."""
    count_invalid(budgets, attempt, ran.invalid_calls)


def count_invalid(budgets: Budgets, attempt: int, calls: int) -> None:
    """``calls`` tool calls of ``attempt`` answered ``error: ...`` (a batch's, or a refused run-tool call)."""
    budgets.invalid_tool_calls += calls
    budgets.attempt_usage(attempt).invalid_tool_calls += calls


def charge_failure(budgets: Budgets, err: BaseException, attempt: int | None = None) -> None:
    """A model step's final failure: the tokens its tries spent and its transport failures (both ride in the
    failure's first detail, :class:`pipeline.activities.spend.Spend`), to the run and to ``attempt``."""
    details = failure_details(err)
    spent = details[0] if details else None
    if not isinstance(spent, dict):
        return
    _charge(
        budgets,
        attempt,
        int(spent.get("prompt_tokens", 0)),
        int(spent.get("completion_tokens", 0)),
        int(spent.get("transport_failures", 0)),
    )


def charge_proposal(budgets: Budgets, attempt: int, proposal: ProposalResult) -> None:
    """A whole attempt's proposal made in one step (the external agent engine): its tokens to the run and the
    attempt (its requests went through the engine's proxy, which counted them, not as separate calls)."""
    _charge(budgets, attempt, proposal.prompt_tokens, proposal.completion_tokens, 0)
    usage = budgets.attempt_usage(attempt)
    usage.model = proposal.model or usage.model
    budgets.model = proposal.model or budgets.model


def count_no_patch(budgets: Budgets, err: BaseException) -> None:
    """A ``NoPatch`` attempt: a no-op patch when its failure says so, otherwise a refusal (the model declined
    to change anything, or the patch policy refused its patch; failures that name no kind count here)."""
    kinds = [d.get(NO_PATCH_KIND) for d in failure_details(err) if isinstance(d, dict) and NO_PATCH_KIND in d]
    if kinds and kinds[0] == NO_OP:
        budgets.no_op_patches += 1
    else:
        budgets.refusals += 1


def is_transport_failure(err: BaseException) -> bool:
    """A step that failed ``Transient`` after its retries: the remote end did not answer usably, so nothing
    is known about the work itself."""
    return failure_class(err) == FailureClass.TRANSIENT


def outage_wait(policy: RunPolicy, waits: int) -> float:
    """Seconds to wait before sending a step again after its ``waits + 1``-th exhausted transport failure in
    a row: ``outage_backoff_s`` doubled every time, at most ``outage_backoff_max_s``."""
    return float(min(policy.outage_backoff_s * 2 ** min(waits, 32), policy.outage_backoff_max_s))


def outage_spent(policy: RunPolicy, down_s: float, wait_s: float) -> bool:
    """Whether waiting ``wait_s`` more would take an outage that has lasted ``down_s`` past the allowance."""
    return down_s + wait_s > policy.model_outage_allowance_s
