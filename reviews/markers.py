"""Hidden markers that tie GitHub objects to the operation that made them, and safe ref names.

A marker is an HTML comment GitHub renders invisibly, e.g. `<!-- durafix:ticket op=wf-1%3Aticket -->`.
Values are percent-encoded so they never contain whitespace or `-->`; parsing tolerates extra spaces,
attribute order, unknown attributes and several markers in one body. Markers are matched only on
objects authored by the adapter's own login, so a pasted marker in someone else's comment is ignored.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

TICKET = "ticket"
COMMENT = "comment"
PULL = "pr"

_MARKER = re.compile(
    r"<!--\s*durafix:(?P<kind>[a-z][a-z0-9_-]*)(?P<attrs>(?:\s+[A-Za-z0-9_-]+=\S+?)*)\s*-->",
)
_ATTR = re.compile(r"([A-Za-z0-9_-]+)=(\S+)")
_SAFE_VALUE = "-._~:/@+"
_REF_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Marker:
    kind: str
    attrs: dict[str, str]

    def render(self) -> str:
        parts = " ".join(f"{k}={quote(v, safe=_SAFE_VALUE)}" for k, v in self.attrs.items())
        return f"<!-- durafix:{self.kind} {parts} -->"


def parse_markers(text: str | None) -> list[Marker]:
    """All durafix markers in `text`, in order of appearance."""
    found: list[Marker] = []
    for match in _MARKER.finditer(text or ""):
        attrs = {k: unquote(v) for k, v in _ATTR.findall(match.group("attrs"))}
        found.append(Marker(match.group("kind"), attrs))
    return found


def find_marker(text: str | None, kind: str) -> Marker | None:
    return next((m for m in parse_markers(text) if m.kind == kind), None)


def strip_markers(text: str) -> str:
    return _MARKER.sub("", text).rstrip()


def with_marker(body: str, marker: Marker) -> str:
    """`body` without any durafix marker of its own, followed by `marker` on its own line."""
    return f"{strip_markers(body)}\n\n{marker.render()}"


def content_sha256(body: str) -> str:
    """Hash of a comment's content as the caller gave it (markers removed, line endings normalised)."""
    return hashlib.sha256(strip_markers(body).replace("\r\n", "\n").encode()).hexdigest()


def ticket_marker(op_id: str) -> Marker:
    return Marker(TICKET, {"op": op_id})


def comment_marker(key: str, sha256: str) -> Marker:
    return Marker(COMMENT, {"key": key, "sha256": sha256})


def pull_marker(run_id: str) -> Marker:
    return Marker(PULL, {"run": run_id})


def ref_component(name: str) -> str:
    """A git-ref-safe path component for `name`.

    Names made only of `[A-Za-z0-9._-]` (without `..`, leading dot or `.lock` ending) map to
    themselves; anything else is rewritten and suffixed with a hash of the original, so distinct names
    keep distinct refs.
    """
    cleaned = _REF_UNSAFE.sub("-", name).strip(".-") or "x"
    cleaned = cleaned.replace("..", "-")
    if cleaned == name and not name.endswith(".lock"):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{cleaned.removesuffix('.lock')}-{digest}"


def ref_prefix(name: str) -> str:
    """The rewritten form of `name` without a hash suffix: a prefix of `ref_component` of any extension."""
    return _REF_UNSAFE.sub("-", name).lstrip(".-").replace("..", "-")


def run_branch_prefix(run_id: str) -> str:
    """Branches a run owns live under `durafix/<run>/`; footprint and cleanup count exactly these."""
    return f"durafix/{ref_component(run_id)}/"
