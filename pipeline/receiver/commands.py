"""``/durafix <command>`` comments: parsing, and the texts the receiver answers them with.

A command is a comment whose body starts with ``/durafix`` followed by the command's name (``/durafix status``);
what follows the name on its line is its argument text, ignored by the commands there are. Pure functions:
the receiver (``pipeline.receiver.webhooks``) decides who may command and what is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pipeline.messages import ticket_body
from pipeline.state import RunState

PREFIX = "/durafix"


class CommandName(StrEnum):
    STATUS = "status"
    CANCEL = "cancel"
    RETRY = "retry"


_HELP = {
    CommandName.STATUS: "say the run's phase, outcome, PR, pending head and budgets",
    CommandName.CANCEL: "cancel the live run (its cleanup runs as on every ending)",
    CommandName.RETRY: "start a new run for this report once its run ended",
}


@dataclass(frozen=True)
class Command:
    """A parsed command: ``name`` as written (lower-cased), ``known`` the command it names, if any."""

    name: str
    known: CommandName | None


def parse_command(body: str | None) -> Command | None:
    """The command ``body`` starts with, or None when it is not a command (``/durafixes`` is not one)."""
    first = (body or "").lstrip().split("\n", 1)[0].strip()
    head, _, rest = first.partition(" ")
    if head.lower() != PREFIX:
        return None
    name = rest.strip().split(" ", 1)[0].lower()
    try:
        known: CommandName | None = CommandName(name)
    except ValueError:
        known = None
    return Command(name=name, known=known)


def help_text(command: Command) -> str:
    """The answer to an unknown command: what the known ones do."""
    said = f"`{PREFIX} {command.name}`" if command.name else f"`{PREFIX}` alone"
    lines = [f"{said} is not a durafix command. The commands are:", ""]
    lines += [f"- `{PREFIX} {name.value}`: {text}" for name, text in _HELP.items()]
    return "\n".join(lines)


def status_text(state: RunState) -> str:
    """The answer to ``/durafix status``: the run's ticket text (phase or outcome, PR, pending head) and its
    budgets."""
    budgets = state.budgets
    lines = [
        ticket_body(state),
        "",
        "Budgets:",
        f"- repair attempts: {budgets.repair_attempts_used}/{budgets.repair_attempts_max}",
        f"- model tokens: {budgets.model_tokens}/{budgets.model_token_budget}",
        f"- revisions on review: {budgets.revisions_used}/{budgets.revisions_max}",
    ]
    if budgets.deadline is not None:
        lines.append(f"- run deadline: {budgets.deadline.isoformat()}")
    if state.pending_approval is not None:
        lines.append(f"- pending head: `{state.pending_approval.head_sha}` on PR #{state.pending_approval.pr_number}")
    return "\n".join(lines)


def no_run_text(issue: int) -> str:
    return f"durafix has no run for #{issue} yet: add the trigger label (or `{PREFIX} retry`) to start one."
