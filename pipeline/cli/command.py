"""What every ``durafix`` command module shares: the shape of a command, how its arguments are added, its
errors, and the sub-command registry that adds them only for the command being run.

A command module exposes ``ARGUMENTS``: for each command it holds, the function that adds the command's
arguments to its sub-parser and sets ``fn`` (a :data:`Command`) as a default, and may set ``check`` (a
:data:`Check`). The ``durafix`` parser lists every command with its one-line help, but imports a module and
adds its arguments only when that command is parsed (:class:`Commands`): every invocation builds the whole
tree, and ``durafix status`` should not pay for the Docker and S3 clients ``durafix cleanup`` and
``durafix evidence`` import.

Commands from outside the product (the local stack's ``dev``, ``demo``, ``chaos``, ...) are added by entry
points of the group :data:`ENTRY_POINTS`: each is named for its command and its value is the module holding it,
which exposes ``SPECS`` (its commands' :class:`Spec`) besides ``ARGUMENTS``; one named like a product command
replaces it. The product never imports those modules by name: ``importlib.metadata`` finds them where the
distribution's metadata lists them (the source checkout's editable install). Where the module is missing (an
installed wheel, which carries the product packages only) its command is still listed and refuses to run
(:func:`needs_source_checkout`).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, TypeAlias

from pipeline.config import DurafixConfig

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3

ENTRY_POINTS = "durafix.commands"
"""The entry-point group of commands added to ``durafix`` from outside the product packages."""

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

    ``module`` is the dotted name of the module whose ``ARGUMENTS[name]`` adds the command's arguments. With
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
        self.refused: set[str] = set()
        """Commands whose module is missing: they run :func:`needs_source_checkout`'s refusal."""

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
            module_name = self._pending.pop(name)
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as err:
                if not _is_missing(err, module_name):
                    raise
                self.choices[name].set_defaults(fn=_refusal(name), takes_rest=True)
            else:
                add_arguments: AddArguments = module.ARGUMENTS[name]
                add_arguments(self.choices[name])
        super().__call__(parser, namespace, values, option_string)


def needs_source_checkout(command: str) -> CliError:
    """The refusal of a command that needs the local stack where it is not (an installed durafix)."""
    return CliError(
        f"`durafix dev` and `demo` run from a source checkout: `durafix {command}` needs the local stack "
        "(the repository's infra/ package), which an installed durafix does not include"
    )


def with_plugins(commands: dict[str, Spec]) -> dict[str, Spec]:
    """``commands`` and those the :data:`ENTRY_POINTS` entry points add, in their metadata's order; one named
    like a command of ``commands`` replaces it in place. A command whose module is missing is listed as one
    that passes its arguments through and refuses to run, unless ``commands`` has one of its name (which then
    stays); any other failure to import a module propagates (it is a bug, not an absent stack)."""
    found = dict(commands)
    for point in entry_points(group=ENTRY_POINTS):
        try:
            module = importlib.import_module(point.value)
        except ModuleNotFoundError as err:
            if not _is_missing(err, point.value):
                raise
            found.setdefault(point.name, Spec(point.value, "(needs a source checkout of durafix)", passes_through=True))
            continue
        specs: dict[str, Spec] = module.SPECS
        found[point.name] = specs[point.name]
    return found


def _is_missing(err: ModuleNotFoundError, module_name: str) -> bool:
    # The module itself or a package above it is absent; a module it imports being absent is a real error.
    return err.name is not None and (module_name == err.name or module_name.startswith(f"{err.name}."))


def _refusal(command: str) -> Command:
    def refuse(args: argparse.Namespace, config: DurafixConfig) -> int:
        raise needs_source_checkout(command)

    return refuse
