"""Why a recipe command failed, when its log shows a cause the recipe or the worker can fix: a pure function of
the command, how it ended and the tail of its log.

:func:`diagnose` recognises a handful of causes that onboarding a repository runs into (a network error in a
setup without ``setup_network``, a command the sandbox does not have, an app that never answered on ``$PORT``,
a readiness path answering another status, tests that reach for the network, an app needed from a recipe that
declares no ``start``, a virtual environment made with a Python that has no ``venv``, a registry whose TLS
certificate setup does not trust) and answers a
:class:`Diagnosis`: the cause as a stable name and a hint saying what to change. Anything else answers ``None``:
an unrecognised failure is said as it is, never guessed at.

A hint is written for a public ticket: it names the recipe's own fields, the recipe's command and the worker's
settings, and never quotes the log (what the repository's commands printed stays in the stored log). A program
the shell did not find is named only when it is a word of the recipe's command.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from enum import StrEnum


class Stage(StrEnum):
    """Which of a recipe's commands failed."""

    SETUP = "setup"
    START = "start"
    FIXTURES = "fixtures"
    TESTS = "tests"


class Cause(StrEnum):
    """A recognised cause, as :func:`diagnose` names it."""

    NO_SETUP_NETWORK = "no-setup-network"
    """A network error in a setup that has no network (``setup_network`` is off)."""
    EGRESS_REFUSED = "egress-refused"
    """A network error in a setup with the network: the egress proxy refused a host, or none was reached."""
    COMMAND_NOT_FOUND = "command-not-found"
    """The shell did not find the program (exit 127)."""
    NOT_LISTENING = "not-listening"
    """The app never answered on ``$PORT``."""
    READINESS_STATUS = "readiness-status"
    """The app answered the readiness path, with another status than the recipe expects (a 404, say)."""
    TESTS_NEED_NETWORK = "tests-need-network"
    """The tests failed with network errors: tests never have the network."""
    NO_APP = "no-app"
    """The app was needed and the recipe declares no ``start`` (the failed command is empty: none was declared)."""
    NO_VENV = "no-venv"
    """Setup made a Python virtual environment with a Python that has no ``venv``/``ensurepip`` (Debian ships them
    in ``python3-venv``)."""
    TLS_UNTRUSTED = "tls-untrusted"
    """Setup reached a registry whose TLS certificate it does not trust: a TLS-inspecting proxy or a mirror behind
    a CA that the worker's CA bundle (``DURAFIX_CA_BUNDLE``) does not hold."""


@dataclass(frozen=True)
class FailedCommand:
    """One failed command of a recipe: its ``stage``, the ``command`` as the recipe wrote it, its ``exit_code``
    (``None``: it timed out, or, for ``start``, it was still running when readiness gave up) and whether setup had
    the network (``setup_network``, the recipe's flag)."""

    stage: Stage
    command: str
    exit_code: int | None = None
    setup_network: bool = False


@dataclass(frozen=True)
class Diagnosis:
    """A recognised :class:`Cause` and the hint saying what to change."""

    cause: Cause
    hint: str


# What package managers and tools print when they cannot reach the network: name resolution failing (npm, pip,
# curl, git, Go, yarn), no route, refused or reset connections, and pip's "no versions" when its index is
# unreachable. Matched case-insensitively on the log's tail.
_NETWORK = re.compile(
    "|".join(
        (
            r"\bEAI_AGAIN\b",
            r"\bENOTFOUND\b",
            r"\bENETUNREACH\b",
            r"\bECONNREFUSED\b",
            r"\bECONNRESET\b",
            r"\bETIMEDOUT\b",
            r"getaddrinfo",
            r"Temporary failure in name resolution",
            r"Name or service not known",
            r"nodename nor servname",
            r"Failed to establish a new connection",
            r"Could not resolve host",
            r"Could not resolve proxy",
            r"Network is unreachable",
            r"No route to host",
            r"dial tcp: lookup",
            r"Connection refused",
            r"\(from versions: none\)",
            r"ERR_PNPM_META_FETCH_FAIL",
            r"unable to access 'https?://",
            r"Max retries exceeded with url",
        )
    ),
    re.IGNORECASE,
)
# The egress proxy's own lines in a setup's log (environments.egress.log_events).
_EGRESS_REFUSED = re.compile(r"^# egress: refused ", re.MULTILINE)
# What Python says when it has no venv module or no ensurepip (Debian's python3 without python3-venv).
_NO_VENV = re.compile(r"ensurepip is not\s+available|No module named '?(?:venv|ensurepip)'?")
# What OpenSSL (Python, pip, curl, git) and Node (npm) say when a server's certificate chain ends in a CA they do
# not trust; a TLS-inspecting proxy presents such a chain.
_TLS_UNTRUSTED = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|SELF_SIGNED_CERT_IN_CHAIN|UNABLE_TO_GET_ISSUER_CERT_LOCALLY"
    r"|self[- ]signed certificate in certificate chain|unable to get local issuer certificate"
    r"|server certificate verification failed"
)
# How shells say a program was not found: dash (``/bin/sh: 1: foo: not found``) and bash (``foo: command not
# found``); with exit 127 also an exec that found no file (``./run.sh: No such file or directory``), which
# without it is any program's missing file.
_NOT_FOUND = re.compile(r"(?:^|[\s:])([\w.+/-]+): (?:command )?not found\s*$", re.MULTILINE)
_NO_SUCH_FILE = re.compile(r"(?:^|[\s:])([\w.+/-]+): No such file or directory\s*$", re.MULTILINE)
# The readiness lines the providers write to the environment's log (environments.readiness.ReadinessVerdict).
_READINESS_STATUS = re.compile(r"^# readiness: GET (\S+) answered (\d{3}), expected (\d{3})", re.MULTILINE)
_READINESS_SILENT = re.compile(r"^# readiness: nothing answered on \$PORT", re.MULTILINE)


def diagnose(failed: FailedCommand, log_tail: str) -> Diagnosis | None:
    """The recognised cause of ``failed``, judged from ``log_tail`` (the end of the command's log), or ``None``.

    In order: a ``start`` with no command (the recipe declares none); a program not found (exit 127, or the shell
    saying so for the failing command); for ``start``, the readiness verdict the provider logged (a status other
    than the expected one, or nothing answering on ``$PORT``); a network error in setup (without the network:
    ``setup_network: true``; with it: the egress allowlist) or in the tests. Pure: no I/O, the same answer for
    the same arguments.
    """
    if failed.stage == Stage.START and not failed.command.strip():
        return Diagnosis(
            Cause.NO_APP,
            "this reproduction needs the app running (a browser procedure) "
            "and durafix.yaml declares no `start`: add `start` (the command serving the app on "
            "`$PORT`) and `readiness`, or reproduce with a command or test",
        )
    missing = _not_found(failed, log_tail)
    if missing is not None:
        return missing
    if failed.stage == Stage.START:
        return _readiness(failed, log_tail)
    network = _NETWORK.search(log_tail) is not None
    if failed.stage == Stage.SETUP:
        if _NO_VENV.search(log_tail):
            return Diagnosis(
                Cause.NO_VENV,
                "setup makes a Python virtual environment and this Python has no venv module (Debian ships it in "
                "the python3-venv package): on the Docker provider add `python3-venv` to `image.packages` in "
                "durafix.yaml; on the local provider the worker's host needs that package",
            )
        if _TLS_UNTRUSTED.search(log_tail) and failed.setup_network:
            # Before the network errors: pip says "Max retries exceeded" about a certificate it refused too.
            return Diagnosis(
                Cause.TLS_UNTRUSTED,
                "setup reached a registry whose TLS certificate it does not trust (a TLS-inspecting proxy, or a "
                "mirror behind your own CA): set the worker's `DURAFIX_CA_BUNDLE` to the CA bundle that holds that "
                "CA (default: the worker's system bundle); `durafix worker --check` tries it",
            )
        if _EGRESS_REFUSED.search(log_tail) and failed.setup_network:
            return Diagnosis(
                Cause.EGRESS_REFUSED,
                "setup asked for a host the egress proxy does not allow (the setup log names it): add the "
                "registry to the worker's `DURAFIX_SETUP_EGRESS` (and its settings to `DURAFIX_SETUP_PASSTHROUGH`), "
                "or install from the default registries",
            )
        if not network:
            return None
        if not failed.setup_network:
            return Diagnosis(
                Cause.NO_SETUP_NETWORK,
                "setup has no network: the recipe does not say `setup_network: true`, which setup needs to "
                "download packages (npm ci, pip install); add it to durafix.yaml",
            )
        return Diagnosis(
            Cause.EGRESS_REFUSED,
            "setup has the network through the egress proxy, which reaches only the registries in the worker's "
            "`DURAFIX_SETUP_EGRESS` on port 443: install from those registries, or have the operator add the host",
        )
    if failed.stage == Stage.TESTS and network:
        return Diagnosis(
            Cause.TESTS_NEED_NETWORK,
            "the tests failed with network errors, and tests never have the network: download what they need in "
            "`setup` (with `setup_network: true`), or leave the tests that need the network out of `test`",
        )
    return None


def _not_found(failed: FailedCommand, log_tail: str) -> Diagnosis | None:
    """A program the shell did not find: exit 127, or (a start command still running, a wrapper's exit code)
    the shell saying so about a word of the command."""
    words = _words(failed.command)
    named = [match[1] for match in _NOT_FOUND.finditer(log_tail)]
    if failed.exit_code == 127:
        named += [match[1] for match in _NO_SUCH_FILE.finditer(log_tail)]
    ours = [name for name in named if name in words or name.rsplit("/", 1)[-1] in words]
    if failed.exit_code != 127 and not ours:
        return None
    program = ours[-1] if ours else ""
    what = f"`{program}` was not found" if program else "a program of the command was not found (exit 127)"
    return Diagnosis(
        Cause.COMMAND_NOT_FOUND,
        f"{what} where the {failed.stage.value} command runs: install it on the worker (the local provider runs "
        "the worker's own tools) or list its package in the recipe's `image.packages` (Docker), or install it in "
        "`setup`",
    )


def _readiness(failed: FailedCommand, log_tail: str) -> Diagnosis | None:
    status = list(_READINESS_STATUS.finditer(log_tail))
    if status:
        path, got, expected = status[-1].groups()
        return Diagnosis(
            Cause.READINESS_STATUS,
            f"the app answered GET {path} with {got} where the recipe's `readiness` expects {expected}: set "
            "`readiness.path` to a page the app serves (or `readiness.expected_status` to what it answers)",
        )
    if _READINESS_SILENT.search(log_tail):
        return Diagnosis(
            Cause.NOT_LISTENING,
            "nothing answered on the app's port: `start` must make the app listen on `$PORT` (durafix picks the "
            "port; a port written in the command or the app's config is not reached), on all interfaces, within "
            "`readiness.deadline_s`",
        )
    return None


def _words(command: str) -> set[str]:
    """The words of ``command`` (shell-split when it parses, else split on blanks), with their base names."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return {w for word in words for w in (word, word.rsplit("/", 1)[-1]) if w}
