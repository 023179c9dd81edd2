"""Secret references in recipes (``name -> 'env:VARIABLE'``), resolved only when a process starts.

A recipe and a recovery spec carry references, never values; a provider resolves them from the worker's
environment at the moment it starts a process and hands the values to that process alone. Nothing that
records state (ownership records, handles, specs) ever sees a value.
"""

from __future__ import annotations

from collections.abc import Mapping

from environments.interface import EnvironmentError

_SCHEMES = ("env",)


class SecretUnavailableError(EnvironmentError):
    """A referenced secret is not available on this worker."""


def parse_secret_ref(ref: str) -> tuple[str, str]:
    """Split ``'env:NAME'`` into ``('env', 'NAME')``; raise ``ValueError`` for unknown forms."""
    scheme, sep, name = ref.partition(":")
    if not sep or scheme not in _SCHEMES or not name:
        raise ValueError(f"secret reference must look like 'env:NAME', got {ref!r}")
    return scheme, name


def resolve_secrets(refs: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """Values for every reference in ``refs``, looked up in ``environ``; raise if any is missing."""
    values = {}
    for name, ref in refs.items():
        _, variable = parse_secret_ref(ref)
        if variable not in environ:
            raise SecretUnavailableError(f"secret {name} references ${variable}, which is not set on this worker")
        values[name] = environ[variable]
    return values
