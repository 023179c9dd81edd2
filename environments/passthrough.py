"""Which of the worker's variables a recipe's setup commands may see: the operator's glob patterns.

A recipe command's environment is built, not inherited (:mod:`environments.commands`). Setup commands are the
one place where the worker's own configuration is needed: a host that reaches its package index through
``PIP_INDEX_URL`` or its proxy through ``HTTPS_PROXY`` cannot install anything otherwise. So the operator
names, with glob patterns (``PIP_*``, ``HTTPS_PROXY``), the variables setup may see; the app, its fixtures
and the tests never get them.

Two rules keep durafix's own secrets out whatever the patterns say:

- :func:`check_patterns` (at configuration time) refuses a pattern that could match a name in durafix's own
  namespaces (``DURAFIX_*``, ``OPENAI_*``; so ``*`` and ``*_PROXY`` are refused too: name the variables) or
  that itself names a credential (``NPM_TOKEN``, ``*SECRET*``).
- :func:`passed_through` (each time a setup command starts) drops every variable in those namespaces and
  every variable named like a credential (token, secret, password, API or access key, auth, cookie) even when a pattern
  matches it: ``PIP_*`` never hands over a ``PIP_PASSWORD``. Credentials for a private index belong in the
  package manager's system-wide configuration (``/etc/pip.conf``, npm's ``/usr/etc/npmrc``), which setup reads
  (its sandbox shows ``/etc`` and ``/usr`` read-only and an empty ``HOME``).

A third rule covers the values: a variable whose value holds a URL with credentials in it
(``https://user:token@host/simple``, ``http://user:pass@proxy:3128``, also as one entry of a space- or
comma-separated list such as ``PIP_EXTRA_INDEX_URL``) is withheld (:func:`screen`), with a warning naming the
variable and never its value, unless the operator named that variable exactly (``PIP_EXTRA_INDEX_URL``, not
``PIP_*``; the default list's ``HTTPS_PROXY`` is durafix's naming, not the operator's, and does not count).
A glob says "the package manager's settings", not "hand my index token to the repository's setup script",
which can read and send on anything in its environment.

Names are compared case-sensitively, as the kernel does; the namespace and credential checks ignore case.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# What durafix itself reads its configuration and secrets from.
OWN_PREFIXES = ("DURAFIX_", "OPENAI_")
# Upper-cased names that look like they hold a credential. ``AUTH`` only as a whole word: GIT_AUTHOR_NAME is not
# one, npm's ``_auth`` is.
_CREDENTIAL = re.compile(
    r"TOKEN|SECRET|PASSW(?:OR)?D|PASSPHRASE|CREDENTIAL|COOKIE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
    r"|(?:^|_)(?:AUTH|PASS)(?:_|$)"
)
_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]!-]+$")
_GLOB = frozenset("*?[")
# What separates the entries of a list-valued variable (``PIP_EXTRA_INDEX_URL="a b"``, ``NO_PROXY="a,b"``).
_SEPARATORS = re.compile(r"[\s,;]+")
# Userinfo without a scheme, as some proxy variables are written (``user:pass@proxy:3128``); an e-mail
# address (``npm_config_email=me@example.com``) has no colon before its ``@`` and is not one.
_BARE_USERINFO = re.compile(r"^[^:/@]+:[^/@]*@")

# The default of ``DURAFIX_SETUP_PASSTHROUGH``: package-manager configuration, proxies and CA bundles.
DEFAULT_PATTERNS = (
    "PIP_*",
    "UV_*",
    "npm_config_*",
    "NPM_CONFIG_*",
    "YARN_*",
    "POETRY_*",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
)


class PassthroughError(ValueError):
    """A pattern could let one of durafix's own secrets reach a setup command, or is not a name pattern."""


def parse_patterns(text: str) -> tuple[str, ...]:
    """``"PIP_*, HTTPS_PROXY"`` -> ``("PIP_*", "HTTPS_PROXY")``, checked by :func:`check_patterns`. ``none``
    (or nothing but commas and spaces) is the empty tuple: setup sees no worker variable beyond the neutral ones."""
    if text.strip().lower() == "none":
        return ()
    return check_patterns(part.strip() for part in text.split(","))


def check_patterns(patterns: Iterable[str]) -> tuple[str, ...]:
    """The patterns, empty ones dropped and duplicates removed (order kept); raise :class:`PassthroughError`
    for one that could match ``DURAFIX_*`` or ``OPENAI_*``, names a credential, or is not a name glob."""
    checked: list[str] = []
    for pattern in patterns:
        if not pattern or pattern in checked:
            continue
        if not _PATTERN.match(pattern):
            raise PassthroughError(f"setup passthrough pattern {pattern!r} is not a variable-name glob")
        for prefix in OWN_PREFIXES:
            if _could_match_prefix(pattern.upper(), prefix):
                raise PassthroughError(
                    f"setup passthrough pattern {pattern!r} could match durafix's own {prefix}* variables, which "
                    "hold its secrets; name the variables setup needs instead"
                )
        if _CREDENTIAL.search(pattern.upper()):
            raise PassthroughError(
                f"setup passthrough pattern {pattern!r} names a credential; durafix never hands credentials to "
                "setup commands (put registry credentials in the package manager's configuration file instead)"
            )
        checked.append(pattern)
    return tuple(checked)


def never_passed(name: str) -> bool:
    """Whether ``name`` is withheld from setup whatever the patterns: durafix's own, or named like a credential."""
    upper = name.upper()
    return upper.startswith(OWN_PREFIXES) or _CREDENTIAL.search(upper) is not None


def holds_url_credentials(value: str) -> bool:
    """Whether ``value``, or one entry of it as a space-, comma- or semicolon-separated list, is a URL with
    userinfo (``scheme://user[:password]@...``, or ``user:password@host`` without a scheme). Fails closed: an
    ``@`` anywhere after a ``scheme://`` counts, so a password with an unescaped ``/`` in it is caught too."""
    for entry in _SEPARATORS.split(value):
        scheme, found, rest = entry.partition("://")
        if found and scheme and "@" in rest:
            return True
        if not found and _BARE_USERINFO.match(entry):
            return True
    return False


@dataclass(frozen=True)
class Screened:
    """What :func:`screen` lets through (``env``) and the names it withheld for credentials in their value."""

    env: dict[str, str]
    withheld: tuple[str, ...] = ()

    def warnings(self) -> list[str]:
        """One sentence per withheld variable, naming it (never its value) and what would pass it."""
        return [
            f"setup passthrough: {name} was not passed to setup: its value holds a URL with credentials; name "
            f"{name} exactly in DURAFIX_SETUP_PASSTHROUGH (not through a glob) to pass it, or put the credentials "
            "in the package manager's configuration file"
            for name in self.withheld
        ]


def screen(patterns: Iterable[str], environ: Mapping[str, str]) -> Screened:
    """The variables of ``environ`` that match one of ``patterns`` and are not :func:`never_passed`; of those,
    one whose value :func:`holds_url_credentials` only when a pattern names it exactly (no ``*``, ``?``, ``[``)
    and ``patterns`` are not :data:`DEFAULT_PATTERNS` (which the operator did not write), the others withheld."""
    wanted = tuple(patterns)
    # The default list is durafix's choice, not the operator's: its exact names (HTTPS_PROXY) pass no credentials.
    exact = set() if set(wanted) == set(DEFAULT_PATTERNS) else {p for p in wanted if not _GLOB & set(p)}
    env: dict[str, str] = {}
    withheld: list[str] = []
    for name, value in environ.items():
        if never_passed(name) or not any(fnmatch.fnmatchcase(name, pattern) for pattern in wanted):
            continue
        if name not in exact and holds_url_credentials(value):
            withheld.append(name)
            continue
        env[name] = value
    return Screened(env, tuple(sorted(withheld)))


def passed_through(patterns: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """What :func:`screen` lets through."""
    return screen(patterns, environ).env


def _could_match_prefix(pattern: str, prefix: str) -> bool:
    """Whether some name starting with ``prefix`` matches the glob ``pattern``.

    Runs the pattern as an automaton over ``prefix``: if any state survives the whole prefix, a suffix can
    complete the match (every glob token matches some text), so such a name exists.
    """
    tokens = _tokens(pattern)

    def closure(states: set[int]) -> set[int]:
        # A ``*`` may match nothing: being before it is also being after it.
        out = set(states)
        for i in sorted(states):
            j = i
            while j < len(tokens) and tokens[j] == "*":
                j += 1
                out.add(j)
        return out

    states = closure({0})
    for char in prefix:
        following: set[int] = set()
        for i in states:
            if i == len(tokens):
                continue
            token = tokens[i]
            if token == "*":
                following.add(i)
            elif token == "?" or (len(token) > 1 and fnmatch.fnmatchcase(char, token)) or token == char:
                following.add(i + 1)
        states = closure(following)
        if not states:
            return False
    return True


def _tokens(pattern: str) -> list[str]:
    """The glob as tokens: ``*``, ``?``, a ``[...]`` class, or one literal character."""
    tokens: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "[":
            end = pattern.find("]", i + 2)
            if end != -1:
                tokens.append(pattern[i : end + 1])
                i = end + 1
                continue
        tokens.append(char)
        i += 1
    return tokens
