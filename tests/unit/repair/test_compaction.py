"""Compaction of a long transcript from durable facts: what is kept, what is stated, how compactions fold."""

from __future__ import annotations

import json
from typing import Any

from infra.modelserver.completions import assistant_turns
from repair.compaction import COMPACTED_MARKER, compact, transcript_chars

OPENING = [{"role": "system", "content": "system"}, {"role": "user", "content": "Bug report: total wrong"}]
PATCH = "diff --git a/cart.py b/cart.py\n--- a/cart.py\n+++ b/cart.py\n@@ -1 +1 @@\n-old\n+new\n"


def turn(n: int, name: str, args: dict[str, str], result: str) -> list[dict[str, Any]]:
    call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": result},
    ]


def conversation(turns: int) -> list[dict[str, Any]]:
    messages = list(OPENING)
    for n in range(1, turns + 1):
        if n % 3 == 0:
            messages += turn(n, "run_tests", {}, "$ make test\nexited 1 (failed) in 0.4 s\noutput:\n" + "x" * 900)
        else:
            messages += turn(n, "read_file", {"path": f"src/f{n}.py"}, "y" * 1000)
    return messages


def test_a_transcript_within_the_limit_is_left_alone() -> None:
    messages = conversation(3)
    assert compact(messages, patch=PATCH, above_chars=transcript_chars(messages)) is None


def test_a_long_transcript_keeps_its_opening_states_its_facts_and_keeps_whole_latest_turns() -> None:
    messages = conversation(12)
    got = compact(messages, patch=PATCH, above_chars=8_000)
    assert got is not None and got == compact(messages, patch=PATCH, above_chars=8_000)  # deterministic
    assert got[:2] == OPENING and transcript_chars(got) < transcript_chars(messages)
    facts = got[2]["content"]
    assert got[2]["role"] == "user" and facts.startswith(f"{COMPACTED_MARKER}: ")
    assert "read_file src/f1.py" in facts and "Ran: $ make test / exited 1 (failed) in 0.4 s" in facts
    assert PATCH in facts
    tail = got[3:]
    assert tail == messages[len(messages) - len(tail) :] and tail[0]["role"] == "assistant"
    asked = {c["id"] for m in tail for c in m.get("tool_calls") or []}
    assert all(m["tool_call_id"] in asked for m in tail if m["role"] == "tool")  # every result follows its call
    # An endpoint counting turns still counts every one, dropped or kept.
    assert assistant_turns(got) == assistant_turns(messages) == 12


def test_a_second_compaction_folds_the_first_and_keeps_its_facts() -> None:
    first = compact(conversation(12), patch=None, above_chars=8_000)
    assert first is not None and "no change against the base" in first[2]["content"]
    longer = first + turn(13, "read_file", {"path": "src/late.py"}, "z" * 6000)
    second = compact(longer, patch=PATCH, above_chars=8_000)
    assert second is not None and sum(COMPACTED_MARKER in str(m.get("content")) for m in second) == 1
    assert "read_file src/f1.py" in second[2]["content"] and PATCH in second[2]["content"]
    assert assistant_turns(second) == 13
