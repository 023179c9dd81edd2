"""External agent engines (``engine: command``): what an agent CLI is told, and how it is started.

An :class:`AgentCommand` turns a :class:`~repair.interface.RepairRequest` into a command line and the
environment it runs with. The caller (``model.agent_command``) runs it in the sandbox with the workspace as its
working directory; whatever the CLI changed in the workspace is the proposal, judged by the same patch policy
and verification as the built-in engine's. The contract for any CLI:

- working directory: the workspace (``/workspace`` in the sandbox), at the base revision, read-write;
  ``DURAFIX_AGENT_DIR``: a writable directory outside it for the CLI's own files (trajectories, caches, its
  ``HOME``);
- ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL``: the attempt's model endpoint (a proxy holding
  the real key, :mod:`repair.model_proxy`), a key valid for this attempt only, and the model name;
- ``DURAFIX_TASK``: the task (the report and what earlier attempts got wrong), also in the file
  ``DURAFIX_TASK_FILE``; ``DURAFIX_TOKEN_BUDGET``: the tokens the attempt may spend (the proxy enforces it);
- ``DURAFIX_SUMMARY_FILE`` (in ``DURAFIX_AGENT_DIR``): where the CLI may write what it did, one paragraph,
  which becomes the proposal's summary (commit message, PR); without it the summary says only that it ran;
- exit code 0 when the CLI considers itself done; anything else fails the attempt. What the CLI printed is
  stored as evidence (redacted) and named, never quoted: it may hold anything the repository's code printed.

Two implementations: :class:`ShellAgent` (any command line, the operator's ``DURAFIX_ENGINE_COMMAND``) and
:class:`MiniSweAgent`, the adapter for mini-swe-agent (:mod:`repair.mini_swe_agent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from environments.untrusted_files import UntrustedFileError, read_beneath
from repair.interface import RepairRequest

TASK_FILE = "task.md"
SUMMARY_FILE = "summary.txt"
MAX_SUMMARY_CHARS = 2000


# The agent directory is the agent's (sandboxed, model-driven) to write: what the worker reads back from it is
# read beneath it with no link followed and a size cap (environments.untrusted_files), never ``read_text``.
MAX_SUMMARY_READ = 64 * 1024


def read_agent_file(agent_dir: Path, name: str, max_bytes: int) -> str:
    """The text of ``name`` in ``agent_dir`` (an untrusted directory), or ``""`` when it was not written or was
    refused: a link (to ``config.json``, ``/proc/self/environ``...), a FIFO, or a file over ``max_bytes`` is never
    read. Undecodable bytes are replaced."""
    try:
        return read_beneath(agent_dir, name, max_bytes=max_bytes).decode("utf-8", errors="replace")
    except UntrustedFileError:
        return ""


def bounded_summary(text: str, fallback: str) -> str:
    """An agent's summary as the proposal carries it: stripped, at most :data:`MAX_SUMMARY_CHARS` characters,
    ``fallback`` when empty."""
    text = text.strip()
    if len(text) > MAX_SUMMARY_CHARS:
        text = text[:MAX_SUMMARY_CHARS] + " [cut]"
    return text or fallback


def task_text(request: RepairRequest) -> str:
    """The agent's task: fix the report, keep the change minimal, and what the earlier attempts got wrong."""
    parts = [
        f"Fix the bug reported in this issue. The repository is checked out in the current directory.\n\n"
        f"Issue: {request.issue_title}\n\n{request.issue_body.strip()}\n",
        "Change only what the fix needs (a regression test is welcome). Do not commit; leave the changes in "
        "the working tree.",
    ]
    if request.previous_failures:
        earlier = "\n".join(f"- {failure}" for failure in request.previous_failures)
        parts.append(f"Earlier attempts at this fix failed:\n{earlier}")
    return "\n\n".join(parts) + "\n"


@dataclass(frozen=True)
class Invocation:
    """One agent run as the sandbox starts it: ``argv`` in the workspace with exactly ``env``, the extra
    directories it reads (``read_only``, e.g. its virtual environment)."""

    argv: list[str]
    env: dict[str, str]
    read_only: tuple[Path, ...] = ()


class AgentCommand(Protocol):
    """An agent CLI the command engine can run."""

    @property
    def name(self) -> str:
        """How failures and heartbeats name the CLI."""
        ...

    def invocation(
        self, request: RepairRequest, *, workspace: Path, agent_dir: Path, base_url: str, api_key: str, model: str
    ) -> Invocation: ...

    def summary(self, agent_dir: Path) -> str:
        """What the agent says it did, from its own files in ``agent_dir`` (bounded; never its output)."""
        ...


def base_env(request: RepairRequest, *, agent_dir: Path, base_url: str, api_key: str, model: str) -> dict[str, str]:
    """The environment of every agent CLI (the contract above); writes the task file into ``agent_dir``."""
    task = task_text(request)
    (agent_dir / TASK_FILE).write_text(task, encoding="utf-8")
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(agent_dir),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": api_key,
        "OPENAI_MODEL": model,
        "DURAFIX_AGENT_DIR": str(agent_dir),
        "DURAFIX_TASK": task,
        "DURAFIX_TASK_FILE": str(agent_dir / TASK_FILE),
        "DURAFIX_SUMMARY_FILE": str(agent_dir / SUMMARY_FILE),
        "DURAFIX_TOKEN_BUDGET": str(request.token_budget),
    }


@dataclass(frozen=True)
class ShellAgent:
    """Any agent CLI: ``command`` run by ``/bin/sh -c`` with the contract's environment."""

    command: str
    read_only: tuple[Path, ...] = ()
    name: str = "command"

    def invocation(
        self, request: RepairRequest, *, workspace: Path, agent_dir: Path, base_url: str, api_key: str, model: str
    ) -> Invocation:
        env = base_env(request, agent_dir=agent_dir, base_url=base_url, api_key=api_key, model=model)
        return Invocation(argv=["/bin/sh", "-c", self.command], env=env, read_only=self.read_only)

    def summary(self, agent_dir: Path) -> str:
        return bounded_summary(
            read_agent_file(agent_dir, SUMMARY_FILE, MAX_SUMMARY_READ),
            f"{self.name} finished without writing {SUMMARY_FILE} (or it was refused)",
        )
