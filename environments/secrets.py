"""Secret references in recipes (``name -> 'env:VARIABLE'``), resolved only when a process starts.

A recipe and a recovery spec carry references, never values; a provider resolves them from the worker's
environment at the moment it starts a process and hands the values to that process alone. Nothing that
records state (ownership records, handles, specs) ever sees a value.

A recipe is written by the repository, so it does not choose which worker variables it gets. A reference
resolves only when both hold:

- the operator's allow-list (``DURAFIX_SECRET_ALLOWLIST``, the provider's ``allowed_secrets``) names the
  variable exactly;
- the variable is not one of durafix's own (``DURAFIX_*``, ``OPENAI_*``: the forge token, the model key, the
  webhook secret and the rest of the worker's configuration). These are refused even when allow-listed: an
  operator's typo must not hand the forge token to code the model wrote.

Anything else is :class:`SecretRefusedError`, raised before any process starts, naming the variable.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from environments.interface import EnvironmentError
from environments.passthrough import OWN_PREFIXES

_SCHEMES = ("env",)


class SecretUnavailableError(EnvironmentError):
    """A referenced secret is not available on this worker."""


class SecretRefusedError(EnvironmentError):
    """A recipe names a worker variable it may not have: durafix's own, or one the operator did not allow."""


def parse_secret_ref(ref: str) -> tuple[str, str]:
    """Split ``'env:NAME'`` into ``('env', 'NAME')``; raise ``ValueError`` for unknown forms."""
    scheme, sep, name = ref.partition(":")
    if not sep or scheme not in _SCHEMES or not name:
        raise ValueError(f"secret reference must look like 'env:NAME', got {ref!r}")
    return scheme, name


def is_own_variable(variable: str) -> bool:
    """Whether ``variable`` is in durafix's own namespaces (``DURAFIX_*``, ``OPENAI_*``), whatever its case."""
    return variable.upper().startswith(OWN_PREFIXES)


def check_allowlist(names: Collection[str]) -> tuple[str, ...]:
    """The operator's allow-list, checked: a name of durafix's own is a ``ValueError`` (the configuration does
    not load), so the refusal is found when the worker starts rather than when a run needs the secret."""
    own = sorted(name for name in names if is_own_variable(name))
    if own:
        raise ValueError(
            f"the secret allow-list names durafix's own variables {', '.join(own)}; they are never given to a "
            "repository's commands"
        )
    return tuple(dict.fromkeys(name.strip() for name in names if name.strip()))


def resolve_secrets(
    refs: Mapping[str, str], environ: Mapping[str, str], *, allowed: Collection[str] = ()
) -> dict[str, str]:
    """Values for every reference in ``refs``, looked up in ``environ``.

    Raise :class:`SecretRefusedError` for a reference to durafix's own variables (even if ``allowed`` names
    it) or to one ``allowed`` does not name, :class:`SecretUnavailableError` for an allowed one that is unset.
    """
    values = {}
    for name, ref in refs.items():
        _, variable = parse_secret_ref(ref)
        if is_own_variable(variable):
            raise SecretRefusedError(
                f"secret {name} references ${variable}: durafix's own variables (DURAFIX_*, OPENAI_*) are never "
                "given to a repository's commands"
            )
        if variable not in allowed:
            raise SecretRefusedError(
                f"secret {name} references ${variable}, which the operator's secret allow-list "
                "(DURAFIX_SECRET_ALLOWLIST) does not name"
            )
        if variable not in environ:
            raise SecretUnavailableError(f"secret {name} references ${variable}, which is not set on this worker")
        values[name] = environ[variable]
    return values
