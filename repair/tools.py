"""The tools offered to the model: their JSON schemas, where a call is carried out, and its replay policy.

``finish(summary)`` is offered like the others but is control flow, handled by the engine's loop. A call that
cannot be carried out (unknown tool, arguments that are not a JSON object of strings, a refused path) does
not end the attempt: its result is an ``error: ...`` text the model can act on, and the turn still counts
against the attempt's ``max_turns``.

Two kinds of tools:

- **workspace tools** (``list_files``, ``read_file``, ``search``, ``replace_in_file``, ``write_file``,
  ``finish``) read or edit the workspace and are carried out here by :func:`run_tool`. They are
  :attr:`Replay.SAFE`: a call started by a worker that died is carried out again, on a workspace rebuilt at
  the recorded pre-state (base + the patch before the call), so it gives the same result and the same patch.
- **run tools** execute the repository's code, in the sandbox, somewhere else than the model's worker.
  ``run_tests`` and ``run`` (:mod:`repair.run_requests` turns their arguments into a command) are
  :attr:`Replay.REPORT_INTERRUPTED`: what the code did cannot be checked against a recorded pre-state, so a
  call that had started and whose result was lost is never run again behind the model's back; its result is
  recorded as :data:`INTERRUPTED` and the model decides what to do. ``run_reproduction`` is
  :attr:`Replay.SAFE`: it is the run's own reproduction (provision the app from base + the patch so far,
  replay the report's procedure, tear down), whose steps are each recorded and recovered like the base
  reproduction's: the procedure only reads the app, and an environment found dead is provisioned anew.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from repair.workspace_tools import ToolRefused, WorkspaceTools

if TYPE_CHECKING:  # the SDK's types only (repair/openai_calls.py says why the SDK is imported late)
    from openai.types.chat import ChatCompletionFunctionToolParam

FINISH = "finish"
RUN_TESTS = "run_tests"
RUN = "run"
RUN_REPRODUCTION = "run_reproduction"
RUN_TOOLS = (RUN_TESTS, RUN, RUN_REPRODUCTION)

INTERRUPTED = (
    "interrupted: the worker carrying out this call was lost while it ran, and its result with it. It is not "
    "run again on its own (it executes the repository's code, which may not be safe to repeat); call the tool "
    "again if you still need its result."
)


class Replay(StrEnum):
    """What happens to a call that had started when its worker died (see the module docstring)."""

    SAFE = "replay-safe"
    REPORT_INTERRUPTED = "report-interrupted"


# The tools that change the workspace (the others read it, or end the attempt).
EDITS = frozenset({"replace_in_file", "write_file"})
ERROR_PREFIX = "error: "


@dataclass(frozen=True)
class _Tool:
    description: str
    params: dict[str, str]
    run: Callable[[WorkspaceTools, dict[str, str]], str] | None
    replay: Replay = Replay.SAFE
    optional: frozenset[str] = frozenset()


_TOOLS: dict[str, _Tool] = {
    "list_files": _Tool(
        "List the files under a directory of the repository, recursively ('.' is the root).",
        {"path": "directory relative to the repository root"},
        lambda ws, a: ws.list_files(a["path"]),
    ),
    "read_file": _Tool(
        "Read a UTF-8 text file of the repository.",
        {"path": "file path relative to the repository root"},
        lambda ws, a: ws.read_file(a["path"]),
    ),
    "search": _Tool(
        "Search the repository's text files for a regular expression; answers path:line: text.",
        {"pattern": "Python regular expression"},
        lambda ws, a: ws.search(a["pattern"]),
    ),
    "replace_in_file": _Tool(
        "Replace text in a file. 'old' must occur exactly once in the file; include enough context.",
        {"path": "file path relative to the repository root", "old": "exact text to replace", "new": "new text"},
        lambda ws, a: ws.replace_in_file(a["path"], a["old"], a["new"]),
    ),
    "write_file": _Tool(
        "Create or overwrite a UTF-8 text file (for new files such as tests).",
        {"path": "file path relative to the repository root", "content": "the whole file content"},
        lambda ws, a: ws.write_file(a["path"], a["content"]),
    ),
    FINISH: _Tool(
        "Call once the fix (and a regression test) is in place; ends the attempt.",
        {"summary": "one paragraph: the cause of the bug and what the change does"},
        lambda ws, a: "finished",
    ),
    RUN_TESTS: _Tool(
        "Run the repository's tests in a sandbox (no network) on the workspace as it is now, and read the "
        "summary and the end of the output. 'files' (optional): space-separated test files to run alone, "
        "when the repository's recipe allows running a subset.",
        {"files": "optional: space-separated test file paths; omit to run the whole test command"},
        None,
        Replay.REPORT_INTERRUPTED,
        frozenset({"files"}),
    ),
    RUN: _Tool(
        "Run one command in a sandbox (no network) in the workspace; only commands the repository's recipe "
        "allows (the error lists them). No shell: the words are passed as they are.",
        {"command": "the command line, e.g. 'npm run lint'"},
        None,
        Replay.REPORT_INTERRUPTED,
    ),
    RUN_REPRODUCTION: _Tool(
        "Replay the bug report's procedure in a browser against the app built from the workspace as it is "
        "now; answers whether the bug still shows and what each check observed.",
        {},
        None,
        Replay.SAFE,
    ),
}

WORKSPACE_TOOLS = tuple(name for name, tool in _TOOLS.items() if tool.run is not None)


def replay_policy(name: str) -> Replay:
    """The named tool's replay policy; an unknown tool's call is answered by an error, safe to repeat."""
    tool = _TOOLS.get(name)
    return tool.replay if tool is not None else Replay.SAFE


def tool_schemas(offered: Sequence[str] | None = None) -> list[ChatCompletionFunctionToolParam]:
    """The schemas of ``offered`` (default: the workspace tools), in the registry's order, so the same
    offer is always the same request bytes."""
    names = set(WORKSPACE_TOOLS if offered is None else offered)
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": tool.description,
                "parameters": {
                    "type": "object",
                    "properties": {p: {"type": "string", "description": d} for p, d in tool.params.items()},
                    "required": [p for p in tool.params if p not in tool.optional],
                    "additionalProperties": False,
                },
            },
        }
        for name, tool in _TOOLS.items()
        if name in names
    ]


def parse_arguments(name: str, raw: str) -> dict[str, str]:
    """The call's arguments, checked against the tool's parameters; :class:`ToolRefused` when they do not fit."""
    tool = _TOOLS.get(name)
    if tool is None:
        raise ToolRefused(f"unknown tool {name!r}; the tools are {', '.join(_TOOLS)}")
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        raise ToolRefused(f"{name}: arguments are not valid JSON") from None
    if not isinstance(args, dict):
        raise ToolRefused(f"{name}: arguments must be a JSON object")
    missing = [
        p for p in tool.params if not isinstance(args.get(p), str) and not (p in tool.optional and args.get(p) is None)
    ]
    if missing:
        raise ToolRefused(f"{name}: missing or non-string argument(s): {', '.join(missing)}")
    return {p: args[p] for p in tool.params if isinstance(args.get(p), str)}


def run_tool(workspace: WorkspaceTools, name: str, arguments: dict[str, str]) -> str:
    """Carry out a parsed workspace-tool call; a refusal comes back as ``error: ...`` text for the model. A
    run tool is not carried out here (``error: ...`` too: a caller routes it to where it runs)."""
    run = _TOOLS[name].run
    if run is None:
        return f"error: {name} is not carried out on the workspace alone"
    try:
        return run(workspace, arguments)
    except ToolRefused as e:
        return f"{ERROR_PREFIX}{e}"
