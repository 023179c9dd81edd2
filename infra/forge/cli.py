"""``forge serve --host H --port P --data-dir DIR --admin-token T``: run the forge until SIGTERM/SIGINT.

The admin token may come from ``DURAFIX_FORGE_ADMIN_TOKEN`` instead of the command line (which other users
of the machine can read). State lives under the data dir and survives a kill and a restart on it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from .server import ForgeServer

TOKEN_ENV = "DURAFIX_FORGE_ADMIN_TOKEN"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forge", description="A local GitHub-compatible server.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the REST API, GraphQL and git over HTTP")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--data-dir", type=Path, required=True)
    serve.add_argument("--admin-token", default=os.environ.get(TOKEN_ENV), help=f"default: ${TOKEN_ENV}")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.admin_token:
        print(f"forge: an admin token is required (--admin-token or ${TOKEN_ENV})", file=sys.stderr)
        return 2
    server = ForgeServer(args.data_dir, args.host, args.port, admin_token=args.admin_token)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # shutdown() blocks until serve_forever returns, so it must not run on the serving thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"forge: serving {server.base_url}", flush=True)
    print(f"forge: api {server.api_url}", flush=True)
    print(f"forge: graphql {server.base_url}/api/graphql", flush=True)
    try:
        server.serve_forever()
    finally:
        server.stop()
    return 0
