"""What the model's run tools may run, and how their results are told back to it.

A ``run_tests`` or ``run`` call becomes one shell command line for the environment provider's sandbox (no
network, none of the worker's secrets), or is refused with a message the model can act on:

- ``run_tests`` without ``files`` runs the recipe's ``test`` command as written; with ``files`` it runs the
  recipe's ``test_subset`` with ``{files}`` replaced by the named files, each shell-quoted. Every named file
  must be a test file by the conventions the patch policy uses (:mod:`environments.test_files`, plus the
  recipe's ``test_files`` globs) and a plain relative path, so the model cannot smuggle options or other
  programs through ``files``. A recipe without ``test_subset`` runs only its whole suite.
- ``run`` runs a command only when its words start with the words of one of the recipe's
  ``agent_commands`` (``npm run lint`` allows ``npm run lint -- --fix``, not ``npm run build``). The words are
  re-quoted one by one, so the shell sees no operator, substitution or redirection the model wrote.

The result text (:func:`render_result`) is what the model reads: a first line saying how the command ended,
then the end of its (already redacted) output, bounded, and where the whole log is stored.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from environments.test_files import is_test_file
from repair.tools import RUN, RUN_TESTS

MAX_OUTPUT_CHARS = 6000
MAX_FILES = 50


class RunRefused(Exception):
    """The call cannot run; the message is shown to the model."""


@dataclass(frozen=True)
class RunRules:
    """What the recipe lets the model run (its ``test``, ``test_subset``, ``test_files`` and ``agent_commands``)."""

    test: str
    test_subset: str | None = None
    test_file_globs: Sequence[str] = ()
    agent_commands: Sequence[str] = field(default_factory=tuple)


def command_for(name: str, arguments: dict[str, str], rules: RunRules) -> str:
    """The shell command line the call ``name(arguments)`` runs, or :class:`RunRefused`."""
    if name == RUN_TESTS:
        return _tests_command(arguments.get("files", ""), rules)
    if name == RUN:
        return _allowed_command(arguments["command"], rules)
    raise RunRefused(f"{name} does not run a command")


def _words(text: str, argument: str) -> list[str]:
    """``text`` split as a shell would; a text it cannot split is refused, naming the call's ``argument``."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise RunRefused(f"{argument}: {e}") from None


def _tests_command(files: str, rules: RunRules) -> str:
    named = _words(files, "files")
    if not named:
        return rules.test
    if rules.test_subset is None:
        raise RunRefused(
            "the recipe declares no test_subset, so only the whole test command runs: call run_tests without files"
        )
    if len(named) > MAX_FILES:
        raise RunRefused(f"files: {len(named)} files is more than the {MAX_FILES} one call may name")
    for path in named:
        pure = PurePosixPath(path)
        if path.startswith("-") or pure.is_absolute() or ".." in pure.parts or ".git" in pure.parts:
            raise RunRefused(f"files: {path!r} is not a plain path inside the repository")
        if not is_test_file(path, rules.test_file_globs):
            raise RunRefused(f"files: {path!r} is not a test file by the repository's conventions")
    return rules.test_subset.replace("{files}", " ".join(shlex.quote(p) for p in named))


def _allowed_command(command: str, rules: RunRules) -> str:
    words = _words(command, "command")
    if not words:
        raise RunRefused("command: empty")
    for allowed in rules.agent_commands:
        prefix = shlex.split(allowed)
        if prefix and words[: len(prefix)] == prefix:
            return shlex.join(words)
    if not rules.agent_commands:
        raise RunRefused("the recipe allows no commands (agent_commands in durafix.yaml); run_tests is available")
    listed = "; ".join(rules.agent_commands)
    raise RunRefused(f"{command!r} is not allowed; the recipe allows commands starting with: {listed}")


def render_result(
    command: str,
    *,
    exit_code: int | None,
    timed_out: bool,
    duration_s: float,
    output: str,
    total_bytes: int,
    log_name: str,
) -> str:
    """The tool result the model reads: how the command ended, then the end of ``output`` (the tail of a log
    of ``total_bytes`` bytes; at most :data:`MAX_OUTPUT_CHARS` characters shown), then where the whole log is."""
    if timed_out:
        ended = f"timed out after {duration_s:.0f} s and was killed"
    elif exit_code == 0:
        ended = "exited 0 (passed)"
    else:
        ended = f"exited {exit_code} (failed)"
    shown = output[-MAX_OUTPUT_CHARS:]
    whole = len(shown.encode()) >= total_bytes
    lines = [f"$ {command}", f"{ended} in {duration_s:.1f} s"]
    lines.append("output:" if whole else f"output (the last {len(shown)} characters of {total_bytes} bytes):")
    lines.append(shown.rstrip() or "(no output)")
    lines.append(f"the whole output is stored as {log_name}")
    return "\n".join(lines)
