"""The reproduction procedure as a reviewer reads it: each step and check as a sentence, fields that are
not set left out.

The stored procedure is the runner's validated model as JSON (every field, unset ones as ``null``, defaults
filled in); an older bundle may hold the YAML the reporter wrote. Both load as a mapping. The text comes from
an issue body, so every value is escaped here; an action or field this module does not know is still shown
(as ``field=value``), so nothing the procedure says is hidden from the reviewer.
"""

from __future__ import annotations

from typing import Any

import yaml

from evidence.markup import code, esc

_STATES = {"visible": "is visible", "hidden": "is hidden", "attached": "is in the page", "detached": "is gone"}
_TEXT_COMPARISONS = {"equals": "is", "not_equals": "is not", "contains": "contains", "matches": "matches"}


def load_procedure(text: str) -> dict[str, Any] | None:
    """The procedure as a mapping with ``steps`` a list, or None when ``text`` is not one."""
    try:
        loaded: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("steps"), list):
        return None
    return loaded


def without_unset(item: object) -> object:
    """``item`` with every ``None`` field of every mapping in it dropped, recursively."""
    if isinstance(item, dict):
        return {k: without_unset(v) for k, v in item.items() if v is not None}
    if isinstance(item, list):
        return [without_unset(v) for v in item]
    return item


def as_yaml(procedure: dict[str, Any]) -> str:
    """The procedure in the shape a reporter writes it (YAML, key order kept, unset fields left out)."""
    return yaml.safe_dump(without_unset(procedure), sort_keys=False, allow_unicode=True, width=100)


def step_html(item: object) -> str:
    """One step or check as HTML: its action, a sentence, and its timeout."""
    if not isinstance(item, dict):
        return code(str(item))
    fields = _set_fields(item)
    action = fields.pop("action", None)
    timeout = fields.pop("timeout_ms", None)
    subject, condition = _parts(action, fields)
    sentence = " ".join(part for part in (subject, condition) if part)
    extra = " ".join(f"{esc(str(k))}={code(_plain(v))}" for k, v in fields.items())
    within = f' <span class="note">within {esc(str(timeout))} ms</span>' if timeout is not None else ""
    head = f"{code(str(action), 'action')} " if action is not None else ""
    return f"{head}{' '.join(p for p in (sentence, extra) if p)}{within}"


def check_parts(item: object) -> tuple[str, str]:
    """A check as (what it reads, what it expects there), both HTML: ``the text of #total``, ``is not $40.00``."""
    if not isinstance(item, dict):
        return code(str(item)), ""
    fields = _set_fields(item)
    action = fields.pop("action", None)
    fields.pop("timeout_ms", None)
    subject, condition = _parts(action, fields)
    extra = " ".join(f"{esc(str(k))}={code(_plain(v))}" for k, v in fields.items())
    return subject or code(str(action)), " ".join(p for p in (condition, extra) if p)


def _parts(action: object, fields: dict[str, Any]) -> tuple[str, str]:
    """(subject, condition) for a known action, consuming the fields it reads; ("", "") otherwise."""

    def take(name: str) -> str:
        return code(_plain(fields.pop(name)))

    has = fields.__contains__
    if action == "goto":
        return f"open {take('path') if has('path') else code('/')}", ""
    if action == "click" and has("selector"):
        return f"click {take('selector')}", ""
    if action == "fill" and has("selector") and has("value"):
        selector, value = take("selector"), take("value")
        return f"fill {selector} with {value}", ""
    if action == "press" and has("selector") and has("key"):
        selector, key = take("selector"), take("key")
        return f"press {key} in {selector}", ""
    if action == "select" and has("selector") and has("value"):
        selector, value = take("selector"), take("value")
        return f"select {value} in {selector}", ""
    if action == "wait_for" and has("selector"):
        selector = take("selector")
        state = fields.pop("state", "visible")
        return f"wait until {selector}", _STATES.get(state, f"is {esc(_plain(state))}")
    if action == "expect_text" and has("selector"):
        subject = f"the text of {take('selector')}"
        for name, verb in _TEXT_COMPARISONS.items():
            if has(name):
                return subject, f"{verb} {take(name)}"
        return subject, ""
    if action == "expect_visible" and has("selector"):
        return take("selector"), "is visible"
    if action == "expect_url" and has("matches"):
        return "the URL (path, query, fragment)", f"matches {take('matches')}"
    if action == "expect_response_status" and has("path") and has("status"):
        path, status = take("path"), take("status")
        return f"the latest response to {path}", f"has status {status}"
    return "", ""


def _set_fields(item: dict[Any, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in item.items() if v is not None}


def _plain(value: object) -> str:
    return value if isinstance(value, str) else str(value)
