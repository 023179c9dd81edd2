"""``durafix init [DIR]``: write a starter ``durafix.yaml`` for the repository in DIR (see
:mod:`environments.recipe_init`) and say what was guessed and what to check.

Exit codes: 0 written; 1 a ``durafix.yaml`` exists (``--force`` overwrites it), no project was recognised or
a manifest could not be read; 2 DIR is not a directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from environments.recipe_init import guess_recipe, write_recipe
from environments.spec import RecipeError
from pipeline.cli.command import EXIT_OK, EXIT_USAGE, AddArguments, CliError
from pipeline.cli.output import print_json
from pipeline.config import DurafixConfig


def cmd_init(args: argparse.Namespace, config: DurafixConfig) -> int:
    """Guess, validate (with the parser every run uses) and write the recipe; nothing is written on failure."""
    directory = Path(args.dir).resolve()
    if not directory.is_dir():
        raise CliError(f"{args.dir} is not a directory", EXIT_USAGE)
    try:
        guess = guess_recipe(directory)
        path = write_recipe(directory, guess, force=args.force)
    except RecipeError as err:
        raise CliError(str(err)) from err
    if args.json:
        print_json(
            {
                "path": str(path),
                "project": guess.project,
                "recipe": guess.recipe.model_dump(mode="json"),
                "guessed": guess.guessed,
                "check": guess.check,
            }
        )
        return EXIT_OK
    print(f"wrote {path} for this {guess.project}")
    print("guessed:")
    for line in guess.guessed:
        print(f"  {line}")
    print("check (also in the file's opening comment):")
    for line in guess.check:
        print(f"  - {line}")
    print(
        "try it with `durafix check DIR` (a dry run in the sandbox), then commit it; `durafix dev onboard DIR` pushes "
        "the repository to the local stack "
        "(docs/onboarding.md in durafix's repository)"
    )
    return EXIT_OK


def _init_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", nargs="?", default=".", help="the repository's root (default: the current directory)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing durafix.yaml")
    parser.add_argument("--json", action="store_true", help="print what was written as one JSON object")
    parser.set_defaults(fn=cmd_init)


ARGUMENTS: dict[str, AddArguments] = {"init": _init_arguments}
