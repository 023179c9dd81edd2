"""Compacting a long attempt's transcript from its durable facts, not by dropping the oldest messages blindly.

When a transcript grows past a size, the next turn sends instead: the opening messages (the system prompt and
the report, as built for the attempt), one user message stating the attempt's facts so far, and the latest
turns whole. The facts are what the dropped turns established and what the workspace holds, all recomputed
from durable state, never summarised by a model:

- the patch so far against the base revision (the workspace is exactly base + this patch), bounded;
- which files the dropped turns read, searched for, listed or edited, and the first line of each run-tool
  result they received (how each ``run_tests``/``run`` ended);
- how many turns were dropped, on the line ``durafix-compacted-turns: N``, so that an endpoint that counts
  turns (the scripted model server) still knows where the conversation is.

The kept tail starts at an assistant message, so every ``tool`` message still follows the assistant message
that asked for it. Compaction is a pure function of the transcript and the patch: a resumed turn compacts
to the very same bytes, and the compacted transcript is what the turn stores.
"""

from __future__ import annotations

import json
from typing import Any

COMPACTED_MARKER = "durafix-compacted-turns"
MAX_PATCH_CHARS = 40_000
_READS = ("read_file", "list_files", "search")
_EDITS = ("replace_in_file", "write_file")
_LOOKED, _EDITED, _RAN = "Looked at: ", "Edited: ", "Ran: "
_LABELS = (_LOOKED, _EDITED)


def transcript_chars(messages: list[dict[str, Any]]) -> int:
    return len(json.dumps(messages, ensure_ascii=False))


def compact(messages: list[dict[str, Any]], *, patch: str | None, above_chars: int) -> list[dict[str, Any]] | None:
    """The compacted transcript, or ``None`` when ``messages`` is within ``above_chars`` or nothing can go
    (a single turn). The kept tail is the latest turns that fit in half of ``above_chars`` (at least the last
    turn). Earlier compactions are folded in: their dropped-turn count adds up."""
    if transcript_chars(messages) <= above_chars:
        return None
    head, body, earlier, folded = _split_head(messages)
    starts = [i for i, m in enumerate(body) if m.get("role") == "assistant"]
    fits = [i for i in starts if transcript_chars(body[i:]) <= above_chars // 2]
    keep_from = fits[0] if fits else (starts[-1] if starts else 0)
    if keep_from == 0:
        return None
    dropped, tail = body[:keep_from], body[keep_from:]
    turns = earlier + sum(1 for m in dropped if m.get("role") == "assistant")
    return [*head, {"role": "user", "content": _facts(dropped, patch, turns, folded)}, *tail]


def _split_head(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, str]:
    """The opening messages, the rest, and the turns and the facts text an earlier compaction left."""
    head, rest = messages[:2], messages[2:]
    if rest and rest[0].get("role") == "user" and COMPACTED_MARKER in str(rest[0].get("content", "")):
        text = str(rest[0]["content"])
        line = next(ln for ln in text.splitlines() if ln.startswith(COMPACTED_MARKER))
        return head, rest[1:], int(line.split(":", 1)[1]), text
    return head, rest, 0, ""


def _facts(dropped: list[dict[str, Any]], patch: str | None, turns: int, folded: str) -> str:
    """The facts message; ``folded`` is an earlier compaction's, whose facts are kept (the patch is restated)."""
    earlier = {k: ln[len(k) :] for ln in folded.splitlines() for k in _LABELS if ln.startswith(k)}
    touched: dict[str, set[str]] = {
        "read": set(filter(None, earlier.get(_LOOKED, "").split("; "))),
        "edited": set(filter(None, earlier.get(_EDITED, "").split(", "))),
    }
    names: dict[str, str] = {}
    runs: list[str] = [ln[len(_RAN) :] for ln in folded.splitlines() if ln.startswith(_RAN)]
    for message in dropped:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            name, args = function.get("name", ""), _arguments(function.get("arguments", ""))
            names[call.get("id", "")] = name
            target = args.get("path") or args.get("pattern")
            if name in _READS and target:
                touched["read"].add(f"{name} {target}")
            if name in _EDITS and target:
                touched["edited"].add(target)
        if message.get("role") == "tool" and names.get(message.get("tool_call_id", "")) in ("run_tests", "run"):
            lines = str(message.get("content", "")).splitlines()
            runs.append(" / ".join(lines[:2]) if lines and lines[0].startswith("$ ") else (lines[0] if lines else ""))
    parts = [
        f"{COMPACTED_MARKER}: {turns}",
        "The conversation was long, so its earlier turns were replaced by these facts from durafix's records.",
    ]
    if touched["read"]:
        parts.append(_LOOKED + "; ".join(sorted(touched["read"])))
    if touched["edited"]:
        parts.append(_EDITED + ", ".join(sorted(touched["edited"])))
    parts += [_RAN + r for r in runs]
    if not patch:
        parts.append("Your workspace has no change against the base revision yet.")
    elif len(patch) <= MAX_PATCH_CHARS:
        parts += ["Your workspace is the base revision plus this patch (your changes so far):", "```diff", patch, "```"]
    else:
        files = [ln[len("+++ b/") :] for ln in patch.splitlines() if ln.startswith("+++ b/")]
        parts.append(
            f"Your changes so far are a {len(patch)}-character patch to: {', '.join(files)}; read those files "
            "to see them."
        )
    return "\n".join(parts)


def _arguments(raw: str) -> dict[str, str]:
    try:
        parsed = json.loads(raw or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in parsed.items() if isinstance(v, str)} if isinstance(parsed, dict) else {}
