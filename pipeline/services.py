"""The worker's wiring: collaborators built lazily from config, and the adapters of each task queue given
them, so a host constructs only what its queues need. Nothing else reaches into this; the adapters receive
their collaborators in their constructors.

Nothing here is cached across activity attempts in a way that trusts a dead worker: the workspace manager's
mirror cache is an optimisation keyed by content (revisions), the dependency cache by content too (lock files,
setup commands) and a workspace restored from it is checked like any other, the browser is relaunched when it
crashed, and environments are re-probed on every use.
"""

from __future__ import annotations

import threading
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from pipeline.config import DurafixConfig

if TYPE_CHECKING:
    from browser.runner import BrowserRunner
    from environments.checks import SetupSettings
    from environments.depcache import DependencyCache
    from environments.interface import EnvironmentProvider
    from environments.workspace import WorkspaceManager
    from evidence.interface import ArtifactStore
    from pipeline.activities.agent_command import CommandActivities
    from pipeline.activities.agent_runs import AgentRunActivities
    from pipeline.activities.browser import BrowserActivities
    from pipeline.activities.environments import EnvironmentActivities
    from pipeline.activities.forge import ForgeActivities
    from pipeline.activities.model import ModelActivities
    from repair.agent_command import AgentCommand
    from repair.interface import RepairEngine
    from repair.openai_calls import ChatEndpoint
    from repair.procedure_draft import ProcedureDrafter
    from reviews.adapter import GitHubForge
    from reviews.app_tokens import InstallationTokens
    from reviews.git_credentials import GitCredentials


class Services:
    def __init__(self, config: DurafixConfig, *, github_app: InstallationTokens | None = None) -> None:
        """``github_app``: a GitHub App token source to share (the receiver's, across its requests) instead of
        one made from ``config`` on first use."""
        self.config = config
        self._lock = threading.Lock()
        self._local = threading.local()
        self._providers: dict[str, EnvironmentProvider] = {}
        self._github_app: InstallationTokens | None = github_app
        self._github_app_read = github_app is not None

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    def close(self) -> None:
        """Release what was built and holds something outside this process's memory: the browser (Chromium, its
        driver and its private home folder). Idempotent; a collaborator never built is not built now."""
        browser = self.__dict__.pop("browser", None)
        if browser is not None:
            browser.close()

    @cached_property
    def store(self) -> ArtifactStore:
        from evidence.open import open_store
        from evidence.s3 import S3Credentials

        creds = None
        if self.config.evidence_access_key and self.config.evidence_secret_key:
            creds = S3Credentials(
                access_key_id=self.config.evidence_access_key, secret_access_key=self.config.evidence_secret_key
            )
        return open_store(
            self.config.resolved_evidence_url(),
            public_url=self.config.evidence_public_url or None,
            credentials=creds,
            link_secret=self.config.evidence_link_secret or None,
        )

    @cached_property
    def workspaces(self) -> WorkspaceManager:
        from environments.workspace import WorkspaceManager

        return WorkspaceManager(cache_dir=self.state_dir / "cache", root=self.state_dir / "workspaces")

    @property
    def dependency_cache_dir(self) -> Path:
        """Where the results of setup are cached per lock hash (pruned by ``durafix cache prune``)."""
        return self.state_dir / "cache" / "deps"

    @property
    def package_cache_dir(self) -> Path:
        """Where the package managers run by setup keep their download caches (npm, yarn, pip, uv, poetry)."""
        return self.state_dir / "cache" / "packages"

    def dependency_cache(self) -> DependencyCache:
        """The dependency cache of this state directory, whether or not setup uses it (pruning needs it anyway)."""
        from environments.depcache import DependencyCache

        return DependencyCache(self.dependency_cache_dir, restore=self.config.dependency_restore)

    @cached_property
    def setup(self) -> SetupSettings:
        """How this worker runs recipe setup commands, for the local provider and for verification and baseline
        runs alike: the dependency cache (unless switched off), the package caches, the passed-through variables,
        the hosts a networked setup may reach."""
        from environments.checks import SetupSettings

        cache = self.dependency_cache() if self.config.dependency_cache else None
        return SetupSettings(
            cache=cache,
            package_caches=self.package_cache_dir,
            passthrough=tuple(self.config.setup_passthrough),
            egress_hosts=tuple(self.config.setup_egress),
            ca_bundle=self.config.ca_bundle_path(),
        )

    def provider(self, name: str | None = None) -> EnvironmentProvider:
        from environments.registry import get_provider

        key = name or self.config.environment_provider
        with self._lock:
            if key not in self._providers:
                self._providers[key] = get_provider(
                    key,
                    self.state_dir / "environments",
                    docker_host=self.config.docker_host or None,
                    setup=self.setup,
                    unsandboxed=self.config.unsandboxed,
                    allowed_secrets=self.config.secret_allowlist,
                )
            return self._providers[key]

    def forge(self, repository: str) -> GitHubForge:
        """The adapter for ``repository``; one per thread, since a PyGithub client is not thread-safe."""
        from reviews.adapter import GitHubForge
        from reviews.config import ForgeConfig

        cache: dict[str, GitHubForge] = self._local.__dict__.setdefault("forges", {})
        if repository not in cache:
            cache[repository] = GitHubForge(
                ForgeConfig(
                    api_url=self.config.forge_api_url,
                    token=SecretStr(self.config.forge_token),
                    repository=repository,
                    git_url=self.config.clone_url(repository),
                    seconds_between_writes=self.config.forge_seconds_between_writes,
                ),
                app=self.github_app,
            )
        return cache[repository]

    @cached_property
    def engine(self) -> RepairEngine:
        from repair.openai_engine import OpenAIToolEngine

        return OpenAIToolEngine(
            base_url=self.config.model_base_url,
            api_key=self.config.model_api_key,
            model=self.config.model_name,
            timeout_s=120.0,
        )

    @cached_property
    def chat_endpoint(self) -> ChatEndpoint:
        """The model endpoint the stepped attempt's turns go to (``model.agent_turn``)."""
        from repair.openai_calls import ChatEndpoint

        c = self.config
        return ChatEndpoint(c.model_base_url, c.model_api_key, c.model_name, timeout_s=120.0)

    @cached_property
    def drafter(self) -> ProcedureDrafter:
        from repair.procedure_draft import ProcedureDrafter

        c = self.config
        return ProcedureDrafter(c.model_base_url, c.model_api_key, c.model_name, timeout_s=120.0)

    @property
    def github_app(self) -> InstallationTokens | None:
        """The GitHub App the worker authenticates as, or None: ``forge_token`` is used. One for all threads
        (made under the lock), so they share its cached installation tokens."""
        from pipeline.github_app import installation_tokens

        with self._lock:
            if not self._github_app_read:
                self._github_app = installation_tokens(self.config)
                self._github_app_read = True
            return self._github_app

    @cached_property
    def git_token(self) -> GitCredentials:
        """What git over HTTPS authenticates with: fresh App installation tokens, else ``forge_token``."""
        from reviews.git_credentials import StaticGitToken

        app = self.github_app
        if app is not None:
            return app.git_credentials(self.config.forge_git_base)
        return StaticGitToken(self.config.forge_token)

    # ---- the adapters of each queue ------------------------------------------------------------------

    def forge_activities(self) -> ForgeActivities:
        from pipeline.activities.forge import ForgeActivities

        return ForgeActivities(
            self.forge,
            self.config.clone_url,
            self.store,
            self.workspaces,
            self.git_token,
            approval_policy=self.config.approval_policy_in_force(),
            operator_approval=self.config.operator_approval,
        )

    def environment_activities(self, host: str = "") -> EnvironmentActivities:
        """``host``: the host whose queue this worker also polls, stamped on its environments (pipeline/hosts.py)."""
        from pipeline.activities.environments import EnvironmentActivities

        # The local provider always: a run's processes may have been started before Docker was configured.
        providers = ["local", self.config.environment_provider]
        return EnvironmentActivities(
            self.store, self.workspaces, self.provider, providers, self.git_token, setup=self.setup, host=host
        )

    def agent_run_activities(self) -> AgentRunActivities:
        """The repair agent's run tools: on the environments queue, where the sandboxes are."""
        from pipeline.activities.agent_runs import AgentRunActivities

        return AgentRunActivities(self.store, self.workspaces, self.provider, self.git_token)

    def browser_activities(self) -> BrowserActivities:
        from pipeline.activities.browser import BrowserActivities

        return BrowserActivities(self.store, lambda: self.browser)

    def model_activities(self) -> ModelActivities:
        from pipeline.activities.model import ModelActivities

        return ModelActivities(
            self.store,
            self.workspaces,
            lambda: self.engine,
            lambda: self.drafter,
            self.git_token,
            patch_policies=self.config.patch_policies,
            endpoint=lambda: self.chat_endpoint,
            command=self.command_activities(),
        )

    def command_activities(self) -> CommandActivities:
        """The external agent engine (``model.agent_command``); its CLI is installed or built on first use."""
        from environments.sandbox import Sandbox
        from pipeline.activities.agent_command import CommandActivities, ModelEndpoint

        c = self.config
        return CommandActivities(
            self.store,
            self.workspaces,
            lambda: self.agent_command,
            ModelEndpoint(c.model_base_url, c.model_api_key, c.model_name),
            lambda: Sandbox.detect(unsandboxed=c.unsandboxed),
            self.git_token,
            deadline_s=c.engine_deadline_s,
            patch_policies=c.patch_policies,
        )

    @cached_property
    def agent_command(self) -> AgentCommand:
        """The operator's agent CLI: the mini-swe-agent adapter (installed under ``tools_dir``, default
        ``STATE/tools``), or a shell
        command line."""
        from repair.agent_command import ShellAgent
        from repair.mini_swe_agent import PACKAGE, MiniSweAgent, install

        c = self.config
        if c.engine_command.strip() == PACKAGE:
            return MiniSweAgent(install(Path(c.tools_dir) if c.tools_dir else self.state_dir / "tools"))
        return ShellAgent(c.engine_command, read_only=tuple(Path(p) for p in c.engine_paths))

    @cached_property
    def browser(self) -> BrowserRunner:
        from browser.runner import BrowserRunner

        video_dir = self.config.state_dir / "playwright-browsers" if self.config.browser_video else None
        return BrowserRunner(video_dir=video_dir, sandbox=self.config.browser_sandbox)
