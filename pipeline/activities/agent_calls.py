"""A stepped attempt's tool calls as history records them: by reference to the stored transcript.

A model turn's answer may ask for a call whose arguments are a whole file (``write_file``) or any text the
model chose to write. Workflow history records each call twice (in the turn's result and in the input of the
step carrying it out) and for as long as the run lasts, so a call crosses it with a reference in place of its
arguments: ``durafix-arguments:sha256:<hex>:<chars>`` (:func:`call_ref`). The step carrying it out reads the
transcript it is given anyway (the turn's, the answer that asked for the call last) and takes the arguments
from there (:func:`carried_call`), so the transcript stays rebuildable from history (the references) plus the
evidence store (the contents).

The reference rides in the ``arguments`` text rather than in fields beside it so that every copy the
workflow makes of a call (it cuts a turn's calls into segments) keeps it. It cannot be mistaken for a
model's arguments: every call of a new turn is turned into a reference, a reference-shaped text the model
wrote included; only results recorded before references hold arguments inline, and those are JSON objects.
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.steps import AgentToolCall
from repair.stepping import ToolCall, arguments_digest, call_in_transcript

REF_PREFIX = "durafix-arguments:sha256:"
_REF = re.compile(r"durafix-arguments:sha256:([0-9a-f]{64}):([0-9]+)")


def call_ref(call: ToolCall) -> AgentToolCall:
    """``call`` as it is recorded in history: its arguments by digest and length, never their text."""
    return AgentToolCall(
        id=call.id, name=call.name, arguments=f"{REF_PREFIX}{arguments_digest(call.arguments)}:{len(call.arguments)}"
    )


def carried_call(messages: list[dict[str, Any]], call: AgentToolCall) -> ToolCall:
    """The call ``call`` names, its arguments read from ``messages`` (the stored transcript of its turn, the
    answer that asked for it last); :class:`repair.stepping.TranscriptMismatch` when they are not there. A
    call recorded with its arguments inline (before calls were references) is taken as it is."""
    ref = _REF.fullmatch(call.arguments)
    if ref is None:
        return ToolCall(id=call.id, name=call.name, arguments=call.arguments)
    return call_in_transcript(messages, call.id, call.name, ref.group(1))
