"""Which of the worker's configured secret files a sandboxed command could read: checked before ``durafix worker``
polls (it refuses to start, exit 2) and reported by ``durafix worker --check``.

The local sandbox (``environments/sandbox.py``) binds ``/usr``, a curated ``/etc`` and the operator's extra
read-only paths into every sandboxed command, and it keeps the worker's uid, so a key file under one of them is
readable by every recipe's tests (whose output a PR links to). The check is made from the sandbox's layout, on
every worker start whatever its queues and provider: the files are on this host, and any worker here that runs
the local provider or an external agent CLI would expose them.

Checked: every setting naming a file the worker reads a secret from (the Temporal client key, certificate and API
key file, the GitHub App's private key) and the state directory (``config.json`` holds tokens, the workspaces
other runs' code). Not checked: the Temporal CA (a public certificate, often kept among the system's own), and
settings given as values (``DURAFIX_EVIDENCE_LINK_SECRET``, the tokens), which the sandbox never receives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from environments.sandbox import Sandbox
from pipeline.config import DurafixConfig

# The setting's variable, the field holding a path to a secret file.
SECRET_FILE_SETTINGS = (
    ("DURAFIX_TEMPORAL_TLS_KEY", "temporal_tls_key"),
    ("DURAFIX_TEMPORAL_TLS_CERT", "temporal_tls_cert"),
    ("DURAFIX_TEMPORAL_API_KEY_FILE", "temporal_api_key_file"),
    ("DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE", "github_app_private_key_file"),
)


@dataclass(frozen=True)
class Exposure:
    """A configured file a sandboxed command could read: the setting, its path, and the sandbox's visible path
    it falls under."""

    setting: str
    path: str
    under: str

    def describe(self) -> str:
        return (
            f"{self.setting}={self.path} is readable inside the sandbox every recipe's commands run in "
            f"(it is under {self.under}, which the sandbox mounts); move it outside /usr and the extra read-only "
            "paths (e.g. under /etc/durafix/: /etc is curated, docs/security.md)"
        )


def worker_sandbox(config: DurafixConfig) -> Sandbox:
    """The sandbox layout this configuration's commands run in, with every extra read-only path it may add:
    the shell agent CLI's ``engine_paths`` and, for the external engine, its install directory."""
    extra = [Path(p) for p in config.engine_paths]
    if config.engine == "command":
        extra.append(Path(config.tools_dir) if config.tools_dir else config.state_dir / "tools")
    return Sandbox(read_only=tuple(extra))


def exposures(config: DurafixConfig, sandbox: Sandbox | None = None) -> list[Exposure]:
    """Every configured secret file (and the state directory) that ``sandbox`` (default: :func:`worker_sandbox`)
    exposes, in :data:`SECRET_FILE_SETTINGS` order; empty when none is."""
    boxed = sandbox if sandbox is not None else worker_sandbox(config)
    named: list[tuple[str, str]] = [(var, str(getattr(config, field))) for var, field in SECRET_FILE_SETTINGS]
    named.append(("DURAFIX_STATE_DIR", str(config.state_dir)))
    found = []
    for setting, path in named:
        if not path:
            continue
        under = boxed.exposes(Path(path))
        if under is not None:
            found.append(Exposure(setting, path, under))
    return found
