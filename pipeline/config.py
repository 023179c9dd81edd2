"""Configuration: one state directory, a ``config.json`` in it (written by ``durafix dev up``), env overrides.

Precedence: environment variables > ``STATE/config.json`` > defaults. The state directory is
``$DURAFIX_STATE_DIR`` or ``.durafix`` under the current directory. Secrets (tokens, keys) may be given by
environment only; ``config.json`` written by the dev stack holds the local stack's throwaway tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from environments.ca_bundle import SYSTEM_BUNDLE
from environments.depcache import RestoreMode
from environments.egress import DEFAULT_REGISTRY_HOSTS, parse_hosts
from environments.passthrough import DEFAULT_PATTERNS, check_patterns, parse_patterns
from environments.secrets import check_allowlist
from pipeline.pricing import PRICES_SETTING, ModelPrice
from repair.patch_policy import PatchPolicy
from reviews.approval_policy import ApprovalPolicy


class SettingsError(ValueError):
    """A setting cannot be used as given (found when it is used, not when the configuration loads: a command that
    does not need it still runs); the message names the setting and what to do. ``durafix`` prints it and exits 2."""


class DurafixConfig(BaseModel):
    state_dir: Path
    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    # How to reach a secured cluster (pipeline/temporal_connection.py): TLS on/off (unset: on as soon as any of
    # the others is set), a PEM CA to verify the server with, an mTLS client certificate and key (absolute
    # paths), the server name to verify instead of the address's host, an API key (or a file holding it).
    temporal_tls: bool | None = None
    temporal_tls_ca: str = ""
    temporal_tls_cert: str = ""
    temporal_tls_key: str = ""
    temporal_tls_server_name: str = ""
    temporal_api_key: str = ""
    temporal_api_key_file: str = ""
    forge_api_url: str = "https://api.github.com"
    forge_git_base: str = "https://github.com"
    forge_token: str = ""
    # Authenticating as a GitHub App instead of with forge_token (pipeline/github_app.py): its App ID, the
    # absolute path of its private key (PEM), and optionally the installation to use (unset: the installation on
    # each repository, looked up with the App's JWT).
    github_app_id: int | None = None
    github_app_private_key_file: str = ""
    github_app_installation_id: int | None = None
    webhook_secret: str = ""
    trigger_label: str = "durafix"
    # The least repository role whose trigger (the label added, or an issue opened with it) starts a run.
    trigger_permission: Literal["read", "triage", "write", "maintain", "admin"] = "triage"
    # The least repository permission whose review may approve or reject a run through the webhook.
    approver_permission: Literal["write", "admin"] = "write"
    # The approval policy (reviews/approval_policy.py): who may approve, how many must, how long an approval
    # stands, under which version. Unset: the default policy at ``approver_permission``, its shorthand; a policy
    # that names no ``min_permission`` takes ``approver_permission`` too. See ``approval_policy_in_force``.
    approval_policy: ApprovalPolicy | None = None
    # Whether an operator's `durafix approve` may merge without an approving review on the forge. Anyone who can
    # reach Temporal can send what the CLI sends, so this is off unless the Temporal connection is guarded.
    operator_approval: bool = False
    model_base_url: str = "https://api.openai.com/v1"
    model_api_key: str = ""
    model_name: str = "gpt-4o-mini"
    # Who writes the patches of the runs this configuration starts (the run policy keeps it): the built-in agent,
    # or an external agent CLI run by the model worker (docs/repair.md, "External agent engines").
    engine: Literal["builtin", "command"] = "builtin"
    # The model worker's agent CLI: "mini-swe-agent" (the pinned adapter, installed under STATE/tools on first
    # use), or any shell command line following the contract of repair/agent_command.py.
    engine_command: str = "mini-swe-agent"
    # Seconds one run of the agent CLI may take before its process group is killed (capped below the model
    # step's start-to-close timeout).
    engine_deadline_s: float = Field(default=1200.0, gt=0)
    # Where agent CLIs are installed (their virtual environments); empty: STATE/tools.
    tools_dir: str = ""
    # Extra directories (absolute, comma-separated in the variable) a shell agent CLI reads in the sandbox.
    engine_paths: list[str] = Field(default_factory=list)
    # Seconds between two writes one forge client sends (reviews/transport.py). GitHub asks integrations for at
    # least one; a forge that asks for none (a test stack's emulator) may set 0.
    forge_seconds_between_writes: float = Field(default=1.0, ge=0)
    evidence_url: str = ""
    evidence_public_url: str = ""
    # Signs the links a local store's evidence server hands out (the server's DURAFIX_EVIDENCE_LINK_SECRET), so a
    # reviewer on another host opens the PR's evidence links without a token.
    evidence_link_secret: str = ""
    # The operator's token for `durafix serve`'s runs page (/runs), and the key its signed links are made with;
    # empty: the page answers 401 to everyone.
    operator_token: str = ""
    # The Temporal UI's base URL (http://host:8233); empty: the runs page links no run to it.
    temporal_ui_url: str = ""
    evidence_access_key: str = ""
    evidence_secret_key: str = ""
    environment_provider: str = "local"
    docker_host: str = ""
    max_repair_attempts: int = 3
    # Revisions a run attempts when a reviewer requests changes (a budget apart from the repair attempts).
    revisions_max: int = 2
    # What a run does when the base branch moved during its review wait (pipeline/policies.py RunPolicy.base_moved).
    base_moved: Literal["merge", "rebase"] = "merge"
    fast_timeouts: bool = False
    # Record a WebM video of every reproduction run (needs ffmpeg with VP9; the worker refuses to start without).
    browser_video: bool = False
    # Chromium's own sandbox. Off (--no-sandbox, logged at every launch) only for hosts where it cannot run.
    browser_sandbox: bool = True
    # Reuse the result of a recipe's setup per lock hash (STATE/cache/deps) instead of running it in every workspace.
    dependency_cache: bool = True
    # How a cached setup is put into a workspace, as files of its own: "auto" (reflinks, else copies) or "copy".
    dependency_restore: RestoreMode = "auto"
    # Glob patterns of the worker variables setup commands may see (and only they); see environments/passthrough.py.
    setup_passthrough: list[str] = Field(default_factory=lambda: list(DEFAULT_PATTERNS))
    # The host names a sandboxed setup with setup_network: true may reach through its egress proxy (port 443,
    # CONNECT only, never a loopback, private or link-local address); see environments/egress.py.
    setup_egress: list[str] = Field(default_factory=lambda: list(DEFAULT_REGISTRY_HOSTS))
    # The CA certificates the Docker provider's images trust besides Debian's (environments/docker/trust.py):
    # a PEM file, or "none" for Debian's only.
    ca_bundle: str = SYSTEM_BUNDLE
    # What a model-written patch may change, per repository ("OWNER/REPO", or "*" for every other one); the
    # safe defaults of repair/patch_policy.py for a repository not named. Only the operator sets this: nothing
    # in a repository or an issue can (docs/security.md, "Patch policy").
    patch_policies: dict[str, PatchPolicy] = Field(default_factory=dict)
    # Prices per million prompt/completion tokens by model name, so `durafix status` can say what a run cost
    # (pipeline/pricing.py); empty: the cost is unknown.
    model_prices: dict[str, ModelPrice] = Field(default_factory=dict)
    # Run the local provider's commands as plain host processes when bubblewrap is unusable (the ticket says so).
    unsandboxed: bool = False
    # Worker variables a recipe's ``secrets`` may name; DURAFIX_* and OPENAI_* never (environments/secrets.py).
    secret_allowlist: list[str] = Field(default_factory=list)
    # The reconciler (pipeline/ops/reconciler.py): seconds between its passes, and the repositories ("OWNER/REPO",
    # comma-separated in the variable) whose labelled issues it checks for a lost trigger besides those of open runs.
    reconcile_interval_s: float = Field(default=60.0, gt=0)
    reconcile_repositories: list[str] = Field(default_factory=list)
    # The webhook receiver: how old (by the time its payload says it happened) a delivery may be and still start
    # or cancel anything (pipeline/replays.py; default 3 days; keep it within the namespace's retention), and
    # the body bytes all connections together may hold before their signature is checked (pipeline/receiver/limits.py).
    delivery_max_age_s: float = Field(default=3 * 24 * 3600.0, gt=0)
    receiver_buffer_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # How many runs the workflow worker keeps in memory between their tasks (the SDK's sticky cache; 1000 is the
    # SDK's default). 0 makes every task of a run replay its whole history on whichever worker takes it: what a
    # worker restarted for each task would do, so a run must finish the same way with it (tests/recovery).
    max_cached_workflows: int = Field(default=1000, ge=0)
    # This worker host's identity (pipeline/hosts.py): the environments it provisions are reached through its own
    # task queue. Empty: the host name. Worker processes on one host share it; separate hosts must not.
    host_id: str = ""
    # The port `durafix worker` serves /metrics on, every interface (pipeline/observability/endpoint.py); None:
    # no metrics endpoint and no SDK exporter.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # Per-queue worker limits (pipeline/worker/queue_settings.py): JSON text or a mapping, kept as given and validated
    # when a worker is built, so a mistake in it stops `durafix worker` and no other command.
    queue_settings: str | dict[str, object] = ""
    extra: dict[str, str] = Field(default_factory=dict)

    @field_validator("patch_policies", "model_prices", mode="before")
    @classmethod
    def _json_objects(cls, value: object) -> object:
        """A JSON object (the variable's form: ``{"o/r": {"allowed_paths": [".github/workflows/ci.yml"]}}``,
        ``{"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}}``) or a mapping; an unknown key in a policy or a
        price is refused, so a misspelt setting never loosens nothing."""
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("reconcile_repositories", "engine_paths", mode="before")
    @classmethod
    def _comma_lists(cls, value: object) -> object:
        """Comma-separated in the variable, or a list."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("approval_policy", mode="before")
    @classmethod
    def _approval_policy(cls, value: object) -> object:
        """A JSON object (the variable's form: ``{"version": 2, "required_approvals": 2}``) or a mapping; an
        unknown key is refused, so a misspelt rule never loosens nothing; an empty string is no policy."""
        if isinstance(value, str):
            return json.loads(value) if value.strip() else None
        return value

    def approval_policy_in_force(self) -> ApprovalPolicy:
        """The policy reviews are judged by: ``approval_policy`` with ``approver_permission`` as its
        ``min_permission`` unless it names one, or (unset) the default policy at ``approver_permission``."""
        policy = self.approval_policy
        if policy is None:
            return ApprovalPolicy(min_permission=self.approver_permission)
        if "min_permission" in policy.model_fields_set:
            return policy
        return policy.model_copy(update={"min_permission": self.approver_permission})

    @field_validator("setup_passthrough", mode="before")
    @classmethod
    def _passthrough(cls, value: object) -> object:
        """``"PIP_*,HTTPS_PROXY"`` (the variable's form) or a list; refused when a pattern could reach durafix's
        own secrets (``PassthroughError``, a ``ValueError``: the configuration does not load)."""
        if isinstance(value, str):
            return list(parse_patterns(value))
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return list(check_patterns(value))
        return value

    @field_validator("setup_egress", mode="before")
    @classmethod
    def _egress(cls, value: object) -> object:
        """``"pypi.org,files.pythonhosted.org"`` (the variable's form), ``none``, or a list of host names; anything
        else (an address, a port, a wildcard) refused (``EgressHostError``, a ``ValueError``)."""
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            return list(parse_hosts(value))
        return value

    @field_validator("secret_allowlist", mode="before")
    @classmethod
    def _allowlist(cls, value: object) -> object:
        """``"NPM_TOKEN,SENTRY_DSN"`` (the variable's form) or a list; durafix's own variables refused."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return list(check_allowlist(value))
        return value

    @property
    def config_file(self) -> Path:
        return self.state_dir / "config.json"

    def ca_bundle_path(self) -> Path | None:
        """``ca_bundle`` as a path, ``None`` for ``none`` (or empty): images trust Debian's certificates only."""
        text = self.ca_bundle.strip()
        return None if text.lower() in {"", "none"} else Path(text)

    def forge_credentials_configured(self) -> bool:
        """Whether the worker can authenticate to the forge at all: a token, or a GitHub App."""
        return bool(self.forge_token) or self.github_app_id is not None

    def clone_url(self, repository: str) -> str:
        return f"{self.forge_git_base.rstrip('/')}/{repository}.git"

    def resolved_evidence_url(self) -> str:
        return self.evidence_url or (self.state_dir / "evidence").resolve().as_uri()

    def save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = self.model_dump(mode="json", exclude={"state_dir"})
        tmp = self.config_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.chmod(0o600)
        tmp.replace(self.config_file)


_ENV = {
    "DURAFIX_TEMPORAL_ADDRESS": "temporal_address",
    "DURAFIX_TEMPORAL_NAMESPACE": "temporal_namespace",
    "DURAFIX_TEMPORAL_TLS": "temporal_tls",
    "DURAFIX_TEMPORAL_TLS_CA": "temporal_tls_ca",
    "DURAFIX_TEMPORAL_TLS_CERT": "temporal_tls_cert",
    "DURAFIX_TEMPORAL_TLS_KEY": "temporal_tls_key",
    "DURAFIX_TEMPORAL_TLS_SERVER_NAME": "temporal_tls_server_name",
    "DURAFIX_TEMPORAL_API_KEY": "temporal_api_key",
    "DURAFIX_TEMPORAL_API_KEY_FILE": "temporal_api_key_file",
    "DURAFIX_FORGE_API_URL": "forge_api_url",
    "DURAFIX_FORGE_GIT_BASE": "forge_git_base",
    "DURAFIX_FORGE_TOKEN": "forge_token",
    "DURAFIX_FORGE_SECONDS_BETWEEN_WRITES": "forge_seconds_between_writes",
    "DURAFIX_GITHUB_APP_ID": "github_app_id",
    "DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE": "github_app_private_key_file",
    "DURAFIX_GITHUB_APP_INSTALLATION_ID": "github_app_installation_id",
    "DURAFIX_WEBHOOK_SECRET": "webhook_secret",
    "DURAFIX_TRIGGER_LABEL": "trigger_label",
    "DURAFIX_TRIGGER_PERMISSION": "trigger_permission",
    "DURAFIX_APPROVER_PERMISSION": "approver_permission",
    "DURAFIX_APPROVAL_POLICY": "approval_policy",
    "DURAFIX_OPERATOR_APPROVAL": "operator_approval",
    "OPENAI_BASE_URL": "model_base_url",
    "OPENAI_API_KEY": "model_api_key",
    "DURAFIX_MODEL": "model_name",
    "DURAFIX_ENGINE": "engine",
    "DURAFIX_ENGINE_COMMAND": "engine_command",
    "DURAFIX_ENGINE_DEADLINE_S": "engine_deadline_s",
    "DURAFIX_ENGINE_PATHS": "engine_paths",
    "DURAFIX_TOOLS_DIR": "tools_dir",
    "DURAFIX_EVIDENCE_URL": "evidence_url",
    "DURAFIX_EVIDENCE_PUBLIC_URL": "evidence_public_url",
    "DURAFIX_EVIDENCE_LINK_SECRET": "evidence_link_secret",
    "DURAFIX_OPERATOR_TOKEN": "operator_token",
    "DURAFIX_TEMPORAL_UI_URL": "temporal_ui_url",
    "DURAFIX_ENVIRONMENT_PROVIDER": "environment_provider",
    "DURAFIX_DOCKER_HOST": "docker_host",
    "DURAFIX_MAX_REPAIR_ATTEMPTS": "max_repair_attempts",
    "DURAFIX_REVISIONS_MAX": "revisions_max",
    "DURAFIX_BASE_MOVED": "base_moved",
    "DURAFIX_FAST_TIMEOUTS": "fast_timeouts",
    "DURAFIX_BROWSER_VIDEO": "browser_video",
    "DURAFIX_BROWSER_SANDBOX": "browser_sandbox",
    "DURAFIX_DEPENDENCY_CACHE": "dependency_cache",
    "DURAFIX_DEPENDENCY_RESTORE": "dependency_restore",
    "DURAFIX_SETUP_PASSTHROUGH": "setup_passthrough",
    "DURAFIX_SETUP_EGRESS": "setup_egress",
    "DURAFIX_CA_BUNDLE": "ca_bundle",
    "DURAFIX_PATCH_POLICIES": "patch_policies",
    PRICES_SETTING: "model_prices",
    "DURAFIX_UNSANDBOXED": "unsandboxed",
    "DURAFIX_SECRET_ALLOWLIST": "secret_allowlist",
    "DURAFIX_RECONCILE_INTERVAL_S": "reconcile_interval_s",
    "DURAFIX_RECONCILE_REPOSITORIES": "reconcile_repositories",
    "DURAFIX_DELIVERY_MAX_AGE_S": "delivery_max_age_s",
    "DURAFIX_RECEIVER_BUFFER_BYTES": "receiver_buffer_bytes",
    "DURAFIX_MAX_CACHED_WORKFLOWS": "max_cached_workflows",
    "DURAFIX_HOST_ID": "host_id",
    "DURAFIX_METRICS_PORT": "metrics_port",
    "DURAFIX_QUEUE_SETTINGS": "queue_settings",
}


def default_state_dir() -> Path:
    return Path(os.environ.get("DURAFIX_STATE_DIR", ".durafix")).resolve()


def load_config(state_dir: Path | None = None) -> DurafixConfig:
    """Read ``STATE/config.json`` (if any) and apply environment overrides."""
    state = (state_dir or default_state_dir()).resolve()
    data: dict[str, object] = {}
    path = state / "config.json"
    if path.exists():
        data.update(json.loads(path.read_text()))
    for env, field in _ENV.items():
        if env in os.environ and os.environ[env] != "":
            data[field] = os.environ[env]
    data["state_dir"] = state
    return DurafixConfig.model_validate(data)
