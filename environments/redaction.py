"""Secret values taken out of untrusted output before it is stored as evidence.

What the repository's commands print (setup, the app, the tests) is kept as evidence a reviewer can open, so a
command that prints a secret must not publish it. :class:`Redactor` replaces every known secret value with
``[redacted NAME]``: the values the recipe's secrets resolve to on this worker, and the worker's own credentials
(variables named like a credential: ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*API_KEY*``, ``*_KEY``, and
``DURAFIX_*`` / ``OPENAI_*`` ones holding a credential). A value shorter than :data:`MIN_SECRET_CHARS` is not
redacted (it would garble ordinary output and guards nothing). Redaction is a second line: the sandbox keeps the
worker's credentials from the commands in the first place.

Files are rewritten in chunks with an overlap of the longest value, so a value split across chunk boundaries is
still caught, and a log of any size is redacted in bounded memory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path

from environments.secrets import parse_secret_ref

MIN_SECRET_CHARS = 8
CREDENTIAL_NAMES = ("*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*API_KEY*", "*_KEY", "*CREDENTIAL*")
_CHUNK = 1 << 20


class Redactor:
    """Replaces each of ``secrets`` (name -> value) in text or files; see the module docstring."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        named: dict[str, str] = {}
        for name, value in secrets.items():
            if len(value) >= MIN_SECRET_CHARS:
                named.setdefault(value, name)  # a value known under several names keeps the first
        # Longest first, so a value containing another is replaced whole.
        self._values = sorted(named, key=len, reverse=True)
        self._names = named
        self._pattern = re.compile("|".join(re.escape(v) for v in self._values)) if self._values else None
        self._marks = {v.encode(): f"[redacted {named[v]}]".encode() for v in self._values}
        self._bytes_pattern = (
            re.compile(b"|".join(re.escape(v) for v in sorted(self._marks, key=len, reverse=True)))
            if self._marks
            else None
        )
        self._overlap = max((len(v) for v in self._marks), default=0)

    def __bool__(self) -> bool:
        return bool(self._values)

    def text(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: f"[redacted {self._names[m.group(0)]}]", text)

    def file(self, source: Path, dest: Path) -> Path:
        """Write ``source`` with every secret replaced to ``dest`` (which may not be ``source``); return ``dest``."""
        with source.open("rb") as src, dest.open("wb") as out:
            carry = b""
            while True:
                chunk = src.read(_CHUNK)
                done, carry = self._replace(carry + chunk, final=not chunk)
                out.write(done)
                if not chunk:
                    return dest

    def _replace(self, data: bytes, *, final: bool) -> tuple[bytes, bytes]:
        """(what can be written now, what to carry into the next chunk). A match starting before the cut has at
        least the longest value's length of data after it, so the longest value there is already decided."""
        if self._bytes_pattern is None:
            return data, b""
        cut = len(data) if final else max(0, len(data) - (self._overlap - 1))
        out, pos = bytearray(), 0
        for match in self._bytes_pattern.finditer(data):
            if match.start() >= cut:
                break
            out += data[pos : match.start()] + self._marks[match.group(0)]
            pos = match.end()
        end = max(pos, cut)
        out += data[pos:end]
        return bytes(out), data[end:]


def worker_secrets(recipe_secrets: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values to redact on this worker: the recipe's secret references resolved (those set here), and every
    variable whose name looks like a credential (:data:`CREDENTIAL_NAMES`)."""
    environ = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for name, ref in recipe_secrets.items():
        _, variable = parse_secret_ref(ref)
        if environ.get(variable):
            found[name] = environ[variable]
    for variable, value in environ.items():
        if value and any(fnmatchcase(variable.upper(), pattern) for pattern in CREDENTIAL_NAMES):
            found.setdefault(variable, value)
    return found


def redactor_for(recipe_secrets: Mapping[str, str], extra: Iterable[tuple[str, str]] = ()) -> Redactor:
    """The :class:`Redactor` for a recipe on this worker, plus ``extra`` (name, value) pairs the caller holds
    (a forge token passed in code rather than through the environment)."""
    secrets = worker_secrets(recipe_secrets)
    for name, value in extra:
        if value:
            secrets.setdefault(name, value)
    return Redactor(secrets)
