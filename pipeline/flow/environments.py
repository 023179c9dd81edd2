"""Environments: provision a revision (with a patch), reproduce the report there, tear it down; the hosts that
held them and their share of the cleanup. A command or test reproduction needs no app: it runs in one step on a
fresh workspace of the revision, in the sandbox (``env.reproduce_in_sandbox``); a command reproduction with
``app: true`` runs in the provisioned environment instead of the browser (``env.reproduce_in_environment``, on
the host that holds it), between the same provision and teardown."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from environments.interface import CleanupReport, EnvironmentHandle
    from environments.reproduction import ReproductionKind
    from evidence.interface import ArtifactRef
    from pipeline import steps
    from pipeline.failures import FailureClass, failure_class, failure_details, failure_message
    from pipeline.flow.context import RunContext, RunEnded, detail_ref, host_unreachable, is_cancellation
    from pipeline.ids import op_id
    from pipeline.patches import HOST_AFFINITY_PATCH
    from pipeline.state import (
        EnvironmentFact,
        EnvironmentFailureFact,
        EnvironmentState,
        Outcome,
        Phase,
        ReproductionFact,
        ReproductionOutcome,
    )
    from pipeline.steps import (
        CleanupRunInput,
        EnvironmentReproduceInput,
        ProvisionInput,
        ReproduceInput,
        ReproduceResult,
        SandboxReproduceInput,
    )

# The revision a candidate's reproduction is run and its outputs stored as while its commit is being made beside
# it (pipeline.flow.side_by_side); :meth:`Environments.tag` puts the commit in once it exists.
UNMADE = ""


class Environments:
    """The run's environments (see the module docstring)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    async def reproduce_on(
        self,
        revision: str,
        patch_ref: ArtifactRef | None,
        label: str,
        provisioning: Phase,
        reproducing: Phase,
        base: str | None = None,
        *,
        beside: bool = False,
    ) -> ReproductionFact:
        """Provision (in phase ``provisioning``) ``patch_ref`` on ``base`` (default: the run's base), reproduce
        (in ``reproducing``), tear down. An environment found dead is provisioned anew, once. A command or test
        reproduction is one step in ``reproducing``, with no environment to provision or tear down; a command
        reproduction with ``app: true`` is provisioned and torn down as a browser procedure is. ``beside``: run
        beside other checks (:mod:`pipeline.flow.side_by_side`), so a sibling's failure cancelling the
        reproduction tears its environment down before it ends (the run's own cancellation leaves it to the run's
        cleanup); one reaching the provisioning leaves what it made to the run's cleanup, as any cancelled
        provisioning does."""
        ctx = self.ctx
        assert ctx.procedure_ref is not None
        if ctx.state.reproduction_kind != ReproductionKind.BROWSER and not ctx.state.reproduction_app:
            ctx.enter(reproducing)
            return await self._in_sandbox(revision, patch_ref, label, base)
        last_detail = ""
        for env_attempt in (1, 2):
            env_op = op_id(ctx.wf, f"env-{label}", env_attempt)
            ctx.enter(provisioning)
            handle = await self._provision(env_op, revision, patch_ref, base)
            if isinstance(handle, ReproductionFact):
                return handle
            repro_op = op_id(ctx.wf, f"reproduce-{label}", env_attempt)
            ctx.enter(reproducing)
            result = await self._reproduce(handle, repro_op, revision, beside)
            if isinstance(result, str):
                last_detail = result
                continue
            return self._reproduced(repro_op, revision, result)
        raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, f"environment for {label} kept dying: {last_detail}")

    async def _provision(
        self, env_op: str, revision: str, patch_ref: ArtifactRef | None, base: str | None
    ) -> EnvironmentHandle | ReproductionFact:
        """A ready environment, or the finding that the app at ``revision`` never became ready."""
        ctx = self.ctx
        assert ctx.procedure_ref is not None
        try:
            handle = await ctx.step(
                steps.PROVISION,
                ProvisionInput(
                    run_id=ctx.wf,
                    op_id=env_op,
                    spec_ref=ctx.spec,
                    patch_ref=patch_ref,
                    provider=ctx.input.environment_provider,
                    base_revision=base,
                ),
            )
        except ActivityError as err:
            if failure_class(err) != FailureClass.NOT_READY:
                raise
            # The app at this revision never became ready: a finding about the revision, not a crash.
            return self._not_ready(env_op, revision, err)
        ctx.live_envs[handle.env_id] = handle
        ctx.state.environment = EnvironmentFact(
            env_id=handle.env_id,
            provider=handle.provider,
            op_id=handle.op_id,
            revision=revision,
            spec_ref=ctx.spec,
            base_url=handle.base_url,
            last_status=EnvironmentState.READY,
            sandbox=handle.sandbox,
            host=handle.host,
        )
        return handle

    def _not_ready(self, op: str, revision: str, err: ActivityError) -> ReproductionFact:
        """The environment of ``revision`` could not be set up (or made ready) for ``op``: the fact, its log kept."""
        ctx = self.ctx
        assert ctx.procedure_ref is not None
        log_ref = detail_ref(err, "log_ref")
        if log_ref is not None:
            ctx.record(log_ref)
        return ReproductionFact(
            op_id=op,
            revision=revision,
            status=ReproductionOutcome.APP_NOT_READY,
            procedure_ref=ctx.procedure_ref,
            detail=failure_message(err),
            log_ref=log_ref,
            environment_failure=environment_failure(err),
        )

    async def _in_sandbox(
        self, revision: str, patch_ref: ArtifactRef | None, label: str, base: str | None
    ) -> ReproductionFact:
        """The command or test reproduction on a fresh workspace of ``patch_ref`` on ``base`` (default: the run's
        base); a setup that fails is the same finding as an app that never became ready."""
        ctx = self.ctx
        assert ctx.procedure_ref is not None
        repro_op = op_id(ctx.wf, f"reproduce-{label}", 1)
        try:
            result = await ctx.step(
                steps.REPRODUCE_IN_SANDBOX,
                SandboxReproduceInput(
                    run_id=ctx.wf,
                    op_id=repro_op,
                    revision=revision,
                    procedure_ref=ctx.procedure_ref,
                    spec_ref=ctx.spec,
                    patch_ref=patch_ref,
                    base_revision=base,
                ),
            )
        except ActivityError as err:
            if failure_class(err) != FailureClass.NOT_READY:
                raise
            return self._not_ready(repro_op, revision, err)
        return self._reproduced(repro_op, revision, result)

    async def _reproduce(
        self, handle: EnvironmentHandle, repro_op: str, revision: str, beside: bool
    ) -> ReproduceResult | str:
        """The procedure run in ``handle``, torn down after (also when cancelled, ``beside`` other checks); or
        why the environment is gone (try a new one)."""
        ctx = self.ctx
        assert ctx.procedure_ref is not None and ctx.state.environment is not None
        host = self.host_of(handle)
        try:
            if ctx.state.reproduction_app:
                # A command reproduction against the app: the same place in the run as the browser's step. No
                # patch: only a run whose reproduction says `app: true` takes this branch, and no run recorded
                # before it can have one (such a reproduction was refused at validation until then).
                result = await ctx.step(
                    steps.REPRODUCE_IN_ENVIRONMENT,
                    EnvironmentReproduceInput(
                        run_id=ctx.wf,
                        op_id=repro_op,
                        revision=revision,
                        procedure_ref=ctx.procedure_ref,
                        environment=handle,
                        spec_ref=ctx.spec,
                    ),
                    host=host,
                )
            else:
                result = await ctx.step(
                    steps.REPRODUCE,
                    ReproduceInput(
                        run_id=ctx.wf,
                        op_id=repro_op,
                        revision=revision,
                        procedure_ref=ctx.procedure_ref,
                        environment=handle,
                        spec_ref=ctx.spec,
                    ),
                    host=host,
                )
        except ActivityError as err:
            if beside and is_cancellation(err) and workflow.cancellation_reason() is None:
                # A sibling check failed (pipeline.flow.side_by_side): the environment is not needed any more. A
                # cancellation of the run itself leaves it to the run's cleanup, which says what it removed.
                await self.teardown(handle)
                raise
            if host and host_unreachable(err):
                # The host is gone or cut off: a teardown there would only wait for it too. What it holds is
                # its share of the run's cleanup at the end.
                ctx.state.environment.last_status = EnvironmentState.GONE
                return f"host {host} holding the environment did not take the reproduction"
            if failure_class(err) != FailureClass.ENVIRONMENT_GONE:
                raise
            ctx.state.environment.last_status = EnvironmentState.GONE
            await self.teardown(handle)
            return failure_message(err)
        await self.teardown(handle)
        return result

    def _reproduced(self, repro_op: str, revision: str, result: ReproduceResult) -> ReproductionFact:
        ctx = self.ctx
        assert ctx.procedure_ref is not None
        ctx.state.budgets.reproduction_runs += result.runs
        for ref in result.artifacts:
            ctx.record(ref)
        return ReproductionFact(
            op_id=repro_op,
            revision=revision,
            status=ReproductionOutcome.of(result.status),
            procedure_ref=ctx.procedure_ref,
            trace_refs=result.trace_refs,
            screenshot_refs=result.screenshot_refs,
            video_refs=result.video_refs,
            log_ref=result.log_ref,
            detail=result.detail,
        )

    def tag(self, fact: ReproductionFact, commit: str) -> ReproductionFact:
        """``fact`` of a reproduction run before the commit it stands for was made (its revision
        :data:`UNMADE`, as its outputs were stored), now as of ``commit``: the fact and its outputs in the run's
        evidence tagged with it."""
        if fact.revision != UNMADE:
            return fact

        def tagged(ref: ArtifactRef) -> ArtifactRef:
            return ref.model_copy(update={"revision": commit}) if ref.revision == UNMADE else ref

        ctx = self.ctx
        ctx.state.evidence = [tagged(ref) for ref in ctx.state.evidence]
        return fact.model_copy(
            update={
                "revision": commit,
                "trace_refs": [tagged(r) for r in fact.trace_refs],
                "screenshot_refs": [tagged(r) for r in fact.screenshot_refs],
                "video_refs": [tagged(r) for r in fact.video_refs],
                "log_ref": tagged(fact.log_ref) if fact.log_ref else None,
            }
        )

    async def teardown(self, handle: EnvironmentHandle) -> None:
        ctx = self.ctx
        host = self.host_of(handle)
        try:
            await ctx.step(steps.TEARDOWN, handle, host=host)
        except ActivityError as err:
            if not (host and host_unreachable(err)):
                raise
            # The host is gone or cut off: what it holds is its share of the run's cleanup (on its queue) at the end.
            workflow.logger.warning("host %s did not take the teardown of %s", host, handle.env_id)
            return
        ctx.live_envs.pop(handle.env_id, None)
        if ctx.state.environment is not None and ctx.state.environment.env_id == handle.env_id:
            ctx.state.environment.last_status = EnvironmentState.TORN_DOWN

    def host_of(self, handle: EnvironmentHandle) -> str:
        """The host the steps reaching ``handle`` must run on (``""``: any; see :mod:`pipeline.hosts`)."""
        if not handle.host or not self.ctx.patched(HOST_AFFINITY_PATCH):
            return ""
        if handle.host not in self.ctx.hosts:
            self.ctx.hosts.append(handle.host)
        return handle.host

    async def cleanup_hosts(self, report: CleanupReport) -> list[str]:
        """Each host that held an environment of the run removes what it holds (added to ``report``); returns
        the hosts that did not take their cleanup in time, whose share remains."""
        unreachable = []
        for host in self.ctx.hosts:
            try:
                part = await self.ctx.step(steps.CLEANUP_RUN, CleanupRunInput(run_id=self.ctx.wf), host=host)
            except ActivityError as err:
                if not host_unreachable(err):
                    raise
                unreachable.append(host)
                continue
            # The general cleanup may have run on this very host: what both report is said once.
            seen = {(r.kind, r.resource_id) for r in report.remaining}
            report.removed.extend(part.removed)
            report.remaining.extend(r for r in part.remaining if (r.kind, r.resource_id) not in seen)
            report.errors.extend(e for e in part.errors if e not in report.errors)
        return unreachable


def environment_failure(err: BaseException) -> EnvironmentFailureFact | None:
    """The failed command a provisioning step's failure names in its details (``environment_failure``), or
    ``None``: the provider named none, or the step ran before the details carried it."""
    for detail in failure_details(err):
        if isinstance(detail, dict) and isinstance(detail.get("environment_failure"), dict):
            return EnvironmentFailureFact.model_validate(detail["environment_failure"])
    return None
