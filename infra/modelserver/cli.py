"""``model serve``: run the scripted model server in the foreground until SIGINT or SIGTERM.

Prints the base URL (``http://host:port/v1``) as its first stdout line once the socket listens, so a parent
that asked for ``--port 0`` learns the port.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evidence.signals import serve_until_signalled
from infra.modelserver.server import ScriptedModelServer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="model", description="Scripted OpenAI-compatible model server.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a script over HTTP")
    serve.add_argument("--script", type=Path, required=True, help="YAML or JSON script file")
    serve.add_argument("--data-dir", type=Path, required=True, help="where requests.jsonl is written")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    server = ScriptedModelServer(args.script, args.data_dir, host=args.host, port=args.port)
    try:
        server.start()
    except (OSError, ValueError) as e:
        print(f"model serve: {e}", file=sys.stderr)
        return 2
    # Started above, so that a script it cannot load is an exit code rather than a traceback.
    serve_until_signalled(server.base_url, lambda: None, server.stop)
    return 0
