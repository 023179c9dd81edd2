"""``durafix resources [--run RUN] [--json]``: what runs own right now, across every holder.

Lists local processes (with whether each is still alive), Docker containers, networks and volumes (when a
Docker engine is configured) and workspaces, as a table (provider, kind, resource ID, run, operation,
status) or, with ``--json``, one document ``{"resources": [...], "unavailable": [...]}``. Read-only: it
never asks Temporal and never changes anything, so it works while the workflow engine is down.

Exit codes: 0 listed, 1 a configured holder could not be listed (named on stderr and under
``unavailable``: the listing is incomplete), 2 usage error, 3 ``--run`` names a run that owns nothing here.
"""

from __future__ import annotations

import argparse
import json
import sys

from environments.inventory import (
    open_holders,
    render_table,
    resource_json,
    resource_row,
    take_inventory,
    unavailable_json,
)
from pipeline.cli.command import AddArguments
from pipeline.cli.run_ids import run_option
from pipeline.config import DurafixConfig

EXIT_OK, EXIT_INCOMPLETE, EXIT_NOT_FOUND = 0, 1, 3


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "List the resources runs own."
    parser.add_argument("--run", help="only this run: repair:OWNER/REPO#N or OWNER/REPO#N")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")

    def check(args: argparse.Namespace) -> None:
        args.run_id = run_option(parser, args.run)

    parser.set_defaults(fn=cmd_resources, check=check)


def cmd_resources(args: argparse.Namespace, config: DurafixConfig) -> int:
    """``resources``: list what ``args.run_id`` owns (what every run owns when it is None)."""
    run_id: str | None = args.run_id
    holders, unopened = open_holders(
        config.state_dir, environment_provider=config.environment_provider, docker_host=config.docker_host
    )
    inventory = take_inventory(holders, unopened, run_id)
    for item in inventory.unavailable:
        print(f"durafix resources: {item.name}: {item.reason} (its resources are not listed)", file=sys.stderr)
    if args.json:
        document = {
            "resources": [resource_json(r) for r in inventory.resources],
            "unavailable": unavailable_json(inventory.unavailable),
        }
        print(json.dumps(document, indent=2))
    elif inventory.resources:
        print(render_table(resource_row(r) for r in inventory.resources))
    else:
        print(f"no resources owned by {run_id}" if run_id else "no owned resources")
    if not inventory.complete:
        return EXIT_INCOMPLETE
    return EXIT_NOT_FOUND if run_id is not None and not inventory.resources else EXIT_OK


ARGUMENTS: dict[str, AddArguments] = {"resources": _arguments}
