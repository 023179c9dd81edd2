"""What every ``durafix`` command module shares: the shape of a command, how its arguments are added, its
errors, and the sub-command registry that adds them only for the command being run.

A command module exposes ``ARGUMENTS``: for each command it holds, the function that adds the command's
arguments to its sub-parser and sets ``fn`` (a :data:`Command`) as a default, and may set ``check`` (a
:data:`Check`). The ``durafix`` parser lists every command with its one-line help, but imports a module and
adds its arguments only when that command is parsed (:class:`Commands`): every invocation builds the whole
tree, and ``durafix status`` should not pay for the Docker and S3 clients ``durafix cleanup`` and
``durafix evidence`` import.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from pipeline.config import DurafixConfig

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3

Command: TypeAlias = Callable[[argparse.Namespace, DurafixConfig], int]
"""Runs a command with its parsed arguments and the loaded configuration; returns the exit code."""

Check: TypeAlias = Callable[[argparse.Namespace], None]
"""A usage check argparse cannot express (an option that only applies with another, a malformed run ID).
Called after parsing and before the configuration is read; a failure is its sub-parser's ``error`` (exit 2).
It may add derived values (a normalized run ID) to the namespace."""

AddArguments: TypeAlias = Callable[[argparse.ArgumentParser], None]
"""Adds one command's arguments to its sub-parser and sets its ``fn`` (and ``check``) defaults."""


class CliError(Exception):
    """A command failed; ``main`` prints ``durafix: <message>`` on stderr and exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Spec:
    """One ``durafix`` command as the top-level parser lists it.

    ``module`` is the module of this package whose ``ARGUMENTS[name]`` adds the command's arguments. With
    ``passes_through`` the command has a parser of its own elsewhere: everything after its name, ``--help``
    included, is handed to it as ``args.rest``.
    """

    module: str
    help: str
    passes_through: bool = False


if TYPE_CHECKING:
    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    # argparse's class is generic only to type checkers.
    _SubParsers = argparse._SubParsersAction


class Commands(_SubParsers):
    """The sub-command registry of the ``durafix`` parser (``add_subparsers(action=Commands)``).

    :meth:`add_command` adds a sub-parser that has only its help; its arguments are added, by importing its
    module, when argparse reaches that command in the command line, before the sub-parser parses the rest.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[str, str] = {}

    def add_command(self, name: str, spec: Spec) -> None:
        parser = self.add_parser(name, help=spec.help, add_help=not spec.passes_through)
        if spec.passes_through:
            parser.set_defaults(takes_rest=True)
        self._pending[name] = spec.module

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        # argparse has checked the name against the choices; values is [name, *rest].
        if isinstance(values, Sequence) and values and values[0] in self._pending:
            name = values[0]
            module = importlib.import_module(f"pipeline.cli.{self._pending.pop(name)}")
            add_arguments: AddArguments = module.ARGUMENTS[name]
            add_arguments(self.choices[name])
        super().__call__(parser, namespace, values, option_string)
