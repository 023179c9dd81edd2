"""The tools offered to the model: their JSON schemas and how a call is carried out.

``finish(summary)`` is offered like the others but is control flow, handled by the engine's loop. A call that
cannot be carried out (unknown tool, arguments that are not a JSON object of strings, a refused path) does
not end the attempt: its result is an ``error: ...`` text the model can act on, and the turn still counts
against the attempt's ``max_turns``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from openai.types.chat import ChatCompletionFunctionToolParam

from repair.workspace_tools import ToolRefused, WorkspaceTools

FINISH = "finish"
# The tools that change the workspace (the others read it, or end the attempt).
EDITS = frozenset({"replace_in_file", "write_file"})
ERROR_PREFIX = "error: "


@dataclass(frozen=True)
class _Tool:
    description: str
    params: dict[str, str]
    run: Callable[[WorkspaceTools, dict[str, str]], str]


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
}


def tool_schemas() -> list[ChatCompletionFunctionToolParam]:
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": tool.description,
                "parameters": {
                    "type": "object",
                    "properties": {p: {"type": "string", "description": d} for p, d in tool.params.items()},
                    "required": list(tool.params),
                    "additionalProperties": False,
                },
            },
        }
        for name, tool in _TOOLS.items()
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
    missing = [p for p in tool.params if not isinstance(args.get(p), str)]
    if missing:
        raise ToolRefused(f"{name}: missing or non-string argument(s): {', '.join(missing)}")
    return {p: args[p] for p in tool.params}


def run_tool(workspace: WorkspaceTools, name: str, arguments: dict[str, str]) -> str:
    """Carry out a parsed call; a refusal comes back as ``error: ...`` text for the model."""
    try:
        return _TOOLS[name].run(workspace, arguments)
    except ToolRefused as e:
        return f"{ERROR_PREFIX}{e}"
