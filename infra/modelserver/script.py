"""The script a :class:`~infra.modelserver.server.ScriptedModelServer` answers from.

A script (YAML or JSON) names the model it serves and lists *conversations*. A request belongs to the first
conversation whose ``match`` regexes are all found (``re.search``) in the request: ``system`` in the first
system message, ``user`` in the first user message; an empty ``match`` takes every request. Turn ``k``
(counting from 0) answers the request that already holds ``k`` assistant messages, so a whole tool-calling
loop is scripted as a list of turns, and two repair attempts (told apart by a marker in the system prompt)
can follow two conversations::

    model: durafix-scripted
    api_key: secret            # optional: only this bearer token is accepted
    conversations:
      - name: first-attempt
        match: {system: "durafix-attempt: 1\\b"}
        turns:
          - content: Reading the code first.
            tool_calls:
              - {name: read_file, arguments: {path: cart.py}}
          - tool_calls:
              - {name: finish, arguments: {summary: done}}

A request that no conversation matches, or that has outrun its conversation's turns, gets an HTTP 400.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ScriptedToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class Turn(BaseModel):
    """One assistant message: text, tool calls, or both."""

    model_config = ConfigDict(extra="forbid")

    content: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)

    @model_validator(mode="after")
    def _says_something(self) -> Turn:
        if self.content is None and not self.tool_calls:
            raise ValueError("a turn needs content, tool_calls, or both")
        return self


class Match(BaseModel):
    """Regexes (``re.search``) a request must contain; an absent key matches anything."""

    model_config = ConfigDict(extra="forbid")

    system: str | None = None
    user: str | None = None

    @field_validator("system", "user")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            re.compile(value)
        return value

    def accepts(self, system: str, user: str) -> bool:
        return all(
            pattern is None or re.search(pattern, text) is not None
            for pattern, text in ((self.system, system), (self.user, user))
        )


class Conversation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    match: Match = Field(default_factory=Match)
    turns: list[Turn] = Field(min_length=1)


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = "durafix-scripted"
    api_key: str | None = None
    conversations: list[Conversation] = Field(min_length=1)

    def find(self, system: str, user: str) -> Conversation | None:
        """The first conversation whose ``match`` accepts this system prompt and first user message."""
        return next((c for c in self.conversations if c.match.accepts(system, user)), None)


def load_script(path: Path) -> Script:
    """Read and validate a script; ``.json`` files are JSON, anything else YAML.

    Raises ``ValueError`` (pydantic's ``ValidationError`` is one) naming what is wrong.
    """
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a script is a mapping with 'conversations', got {type(data).__name__}")
    return Script.model_validate(data)
