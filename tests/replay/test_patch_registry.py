"""The patch registry (:mod:`pipeline.patches`) is complete and in step with the code and the recorded histories.

Every ``workflow.patched`` / ``workflow.deprecate_patch`` call in ``pipeline/`` (wherever the workflow's code
lives) names a registry constant, in the stage its call says; every active or deprecated patch names recorded
histories in ``tests/replay/histories/`` that record its marker (which ``test_replay.py`` replays); and a patch
whose next step is due (against today's date: the policy, not a timing) fails until it is taken.
"""

from __future__ import annotations

import ast
import base64
import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

import pipeline
from pipeline import patches
from pipeline.patches import PATCHES, Patch, Stage
from tests.replay.record import HISTORIES

PIPELINE = Path(pipeline.__file__).parent
PATCH_CALLS = {"patched": Stage.ACTIVE, "deprecate_patch": Stage.DEPRECATED}
TEMPORAL_WORKFLOW = "temporalio.workflow"
VALUE = "<handed on as a value>"


@dataclass(frozen=True)
class CallSite:
    where: str  # path:line
    call: str  # "patched" or "deprecate_patch"
    constant: str | None  # the registry constant the argument names, None when it names none
    argument: str  # the argument's source text


def recorded_markers(path: Path) -> dict[str, bool]:
    """The patch IDs whose marker the history at ``path`` records, each with whether it was deprecated."""
    found: dict[str, bool] = {}
    for event in json.loads(path.read_text())["events"]:
        if event.get("eventType") != "EVENT_TYPE_MARKER_RECORDED":
            continue
        attrs = event["markerRecordedEventAttributes"]
        if attrs.get("markerName") != "core_patch":
            continue
        [payload] = attrs["details"]["patch-data"]["payloads"]
        data = json.loads(base64.b64decode(payload["data"]))
        found[data["id"]] = bool(data.get("deprecated", False))
    return found


def _names(module: ast.Module) -> tuple[dict[str, str], set[str], dict[str, str]]:
    """From a module's imports: local name -> registry constant; local names of the registry module; local
    name -> temporalio.workflow function (``patched``/``deprecate_patch`` imported by name)."""
    registry = patches.__name__
    package, _, leaf = registry.rpartition(".")
    constants: dict[str, str] = {}
    modules: set[str] = set()
    functions: dict[str, str] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                local = alias.asname or alias.name
                if node.module == registry:
                    constants[local] = alias.name
                elif node.module == package and alias.name == leaf:
                    modules.add(local)
                elif node.module == TEMPORAL_WORKFLOW and alias.name in PATCH_CALLS:
                    functions[local] = alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == registry and alias.asname:
                    modules.add(alias.asname)
    return constants, modules, functions


def _workflow_call(func: ast.expr, functions: dict[str, str]) -> str | None:
    """``patched``/``deprecate_patch`` when ``func`` is temporalio's (``workflow.x``, ``temporalio.workflow.x``,
    or the name imported), else None."""
    if isinstance(func, ast.Name):
        return functions.get(func.id)
    if isinstance(func, ast.Attribute) and func.attr in PATCH_CALLS:
        owner = func.value
        if isinstance(owner, ast.Name) and owner.id == "workflow":
            return func.attr
        if ast.unparse(owner) == TEMPORAL_WORKFLOW:
            return func.attr
    return None


def _constant(arg: ast.expr, constants: dict[str, str], modules: set[str]) -> str | None:
    if isinstance(arg, ast.Name):
        return constants.get(arg.id)
    if isinstance(arg, ast.Attribute) and ast.unparse(arg.value) in {*modules, patches.__name__}:
        return arg.attr
    return None


def _argument(node: ast.Call, keyword: str) -> ast.expr | None:
    return node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == keyword), None)


def _wrappers(modules: list[ast.Module]) -> dict[str, tuple[str, str]]:
    """Functions that pass one of their own parameters on to ``workflow.patched``/``deprecate_patch`` (a phase's
    run context asking "is this patch on?"): function name -> (the call, the parameter's name). Their callers
    are the call sites that must name a constant."""
    found: dict[str, tuple[str, str]] = {}
    for module in modules:
        _, _, functions = _names(module)
        for fn in ast.walk(module):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)} - {"self", "cls"}
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and (call := _workflow_call(node.func, functions)) is not None:
                    arg = _argument(node, "id")
                    if isinstance(arg, ast.Name) and arg.id in params:
                        found[fn.name] = (call, arg.id)
    return found


def call_sites(root: Path) -> list[CallSite]:
    """Every call of temporalio's ``workflow.patched``/``workflow.deprecate_patch`` in the modules under ``root``,
    and every call of a function that only passes its parameter on to one (:func:`_wrappers`), in its stead."""
    parsed = [(path, ast.parse(path.read_text(), filename=str(path))) for path in sorted(root.rglob("*.py"))]
    wrappers = _wrappers([m for _, m in parsed])
    sites = []
    for path, module in parsed:
        constants, modules, functions = _names(module)
        passed_on = {
            id(node)
            for fn in ast.walk(module)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name in wrappers
            for node in ast.walk(fn)
            if isinstance(node, ast.Call)
        }
        called = {id(node.func) for node in ast.walk(module) if isinstance(node, ast.Call)}
        for node in ast.walk(module):
            if isinstance(node, ast.expr) and id(node) not in called and (ref := _workflow_call(node, functions)):
                # workflow.patched handed on as a value (a callback in a run context): its calls cannot be checked.
                sites.append(CallSite(f"{path.relative_to(root.parent)}:{node.lineno}", ref, None, VALUE))
            if not isinstance(node, ast.Call) or id(node) in passed_on:
                continue
            call = _workflow_call(node.func, functions)
            keyword = "id"
            if call is None:
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name not in wrappers:
                    continue
                call, keyword = wrappers[name]
            arg = _argument(node, keyword)
            where = f"{path.relative_to(root.parent)}:{node.lineno}"
            text = "" if arg is None else ast.unparse(arg)
            sites.append(CallSite(where, call, None if arg is None else _constant(arg, constants, modules), text))
    return sites


def _is_handler_without_commands(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A query or an Update validator: code that may issue no command and, for validators, never replays."""
    for deco in fn.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and target.attr in ("validator", "query"):
            return True
    return False


def _call_graph(
    module: ast.Module,
) -> tuple[dict[str, ast.FunctionDef | ast.AsyncFunctionDef], dict[str, set[str]], set[str]]:
    """A module's functions by name, the module's functions each calls (by name or as ``self.name``), and the
    functions that ask for a patch themselves (a wrapper's own call passes its caller's ID on: not counted)."""
    _, _, functions = _names(module)
    wrappers = _wrappers([module])
    defs = {fn.name: fn for fn in ast.walk(module) if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)}
    calls: dict[str, set[str]] = {name: set() for name in defs}
    asks: set[str] = set()
    for name, fn in defs.items():
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if _workflow_call(node.func, functions) is not None or (callee in wrappers and name not in wrappers):
                asks.add(name)
            if callee in defs:
                calls[name].add(callee)
    return defs, calls, asks


def patches_asked_without_commands(root: Path) -> list[str]:
    """Each query or Update validator under ``root`` that asks for a patch, itself or through the functions it
    calls (followed within its module)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        defs, calls, asks = _call_graph(ast.parse(path.read_text(), filename=str(path)))
        for name, fn in defs.items():
            if not _is_handler_without_commands(fn):
                continue
            seen, todo = {name}, [name]
            while todo:
                for callee in calls[todo.pop()] - seen:
                    seen.add(callee)
                    todo.append(callee)
            if seen & asks:
                where = f"{path.relative_to(root.parent)}:{fn.lineno}"
                found.append(
                    f"{where}: {name} (a query or an Update validator) asks for a patch via {sorted(seen & asks)}"
                )
    return found


def registry_constants() -> dict[str, str]:
    """The module-level ID constants of the registry module: name -> ID."""
    return {
        name: value
        for name, value in vars(patches).items()
        if name.endswith("_PATCH") and name.isupper() and isinstance(value, str)
    }


def _call_problems(
    by_id: dict[str, Patch], constants: dict[str, str], sites: list[CallSite]
) -> tuple[list[str], dict[str, list[CallSite]]]:
    """What is wrong with the call sites, and the registered patches each calls."""
    found: list[str] = []
    calls: dict[str, list[CallSite]] = {}
    for site in sites:
        if site.argument == VALUE:
            found.append(
                f"{site.where}: workflow.{site.call} is handed on as a value, so what its callers pass is unchecked: "
                "call it in a function taking the patch ID as a parameter"
            )
            continue
        if site.constant is None or site.constant not in constants:
            found.append(
                f"{site.where}: workflow.{site.call}({site.argument}) does not name a constant of {patches.__name__}"
            )
            continue
        patch = by_id.get(constants[site.constant])
        if patch is None:
            continue  # said by problems(): the constant is unregistered
        calls.setdefault(patch.id, []).append(site)
        if PATCH_CALLS[site.call] is not patch.stage:
            found.append(f"{site.where}: workflow.{site.call} of {patch.id!r}, whose registered stage is {patch.stage}")
    return found, calls


def _entry_problems(patch: Patch, calls: list[CallSite], today: date) -> list[str]:
    """What is wrong with one registry entry, given the call sites naming it."""
    found: list[str] = []
    if patch.stage is not Stage.REMOVED and not calls:
        found.append(f"patch {patch.id!r} is {patch.stage} but no code in pipeline/ calls it: register it removed")
    if patch.stage is Stage.REMOVED and calls:
        found.append(f"patch {patch.id!r} is registered removed but still called: {calls[0].where}")
    if patch.stage is not Stage.REMOVED and not patch.fixtures:
        found.append(f"patch {patch.id!r} names no recorded history: record one (tests/replay/record.py)")
    for name in patch.fixtures:
        path = HISTORIES / f"{name}.json"
        if not path.is_file():
            found.append(f"patch {patch.id!r}: its fixture {path.name} is not in {HISTORIES}")
        elif patch.id not in recorded_markers(path):
            found.append(f"patch {patch.id!r}: its fixture {path.name} does not record its marker")
    due = patch.overdue(today)
    return [*found, due] if due is not None else found


def problems(registry: tuple[Patch, ...], constants: dict[str, str], sites: list[CallSite], today: date) -> list[str]:
    """Everything wrong with ``registry`` against the constants, the call sites and the recorded histories."""
    ids = Counter(p.id for p in registry)
    found = [f"ID {i!r} is registered {n} times" for i, n in ids.items() if n > 1]
    by_id = {p.id: p for p in registry}
    found += [f"{name} = {i!r} has no registry entry" for name, i in constants.items() if i not in by_id]
    wrong, calls = _call_problems(by_id, constants, sites)
    found += wrong
    for patch in registry:
        found += _entry_problems(patch, calls.get(patch.id, []), today)
    return found


def today() -> date:
    return datetime.now(UTC).date()


def test_the_registry_matches_the_code_the_histories_and_todays_date() -> None:
    sites = call_sites(PIPELINE)
    assert sites, f"no workflow.patched call found under {PIPELINE}: the walk is broken"
    assert problems(PATCHES, registry_constants(), sites, today()) == []


def test_no_query_or_update_validator_asks_for_a_patch() -> None:
    """A patch asked in a validator would be recorded as a marker outside any workflow task's commands, and a
    validator does not run on replay: what it let through must not depend on a patch."""
    assert patches_asked_without_commands(PIPELINE) == []


def test_a_validator_reaching_a_patch_through_a_helper_is_found(tmp_path: Path) -> None:
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "flow.py").write_text(
        REAL
        + """
class Flow:
    @workflow.update
    async def approve(self, a: int) -> None: ...

    @approve.validator
    def _validate(self, a: int) -> None:
        self._refusal(a)

    def _refusal(self, a: int) -> None:
        if workflow.patched(BASE):
            raise ValueError(a)

    @workflow.query
    def state(self) -> int:
        return 1
"""
    )
    [found] = patches_asked_without_commands(tmp_path / "pipeline")
    assert "_validate" in found and "_refusal" in found, found


def test_every_marker_a_recorded_history_holds_is_registered() -> None:
    registered = {p.id for p in PATCHES}
    for path in sorted(HISTORIES.glob("*.json")):
        unknown = set(recorded_markers(path)) - registered
        assert not unknown, f"{path.name} records patches the registry does not know: {sorted(unknown)}"


def test_removal_dates_are_shipped_plus_the_run_deadline() -> None:
    patch = Patch("x", "why", fixtures=("cancelled",), shipped=date(2026, 11, 29))
    assert patch.needed_until == date(2026, 12, 13)
    assert patch.overdue(date(2026, 12, 13)) is None
    late = patch.overdue(date(2026, 12, 14))
    assert late is not None and "deprecate" in late and "2026-12-13" in late
    deprecated = Patch("x", "why", fixtures=("cancelled",), shipped=date(2026, 11, 29), deprecated=date(2026, 12, 20))
    assert deprecated.stage is Stage.DEPRECATED and deprecated.marker_needed_until == date(2027, 1, 3)
    assert deprecated.overdue(date(2027, 1, 3)) is None
    gone = deprecated.overdue(date(2027, 1, 4))
    assert gone is not None and "remove its workflow.deprecate_patch call" in gone


# ---- the check is falsifiable: each way the registry can be wrong is caught ------------------------------


def _code(tmp_path: Path, source: str) -> list[CallSite]:
    root = tmp_path / "pipeline"
    root.mkdir(parents=True)
    (root / "flow.py").write_text(source)
    return call_sites(root)


REAL = f"""
from temporalio import workflow
from {patches.__name__} import CANCELLATION_PATCH, BASELINE_PATCH as BASE
from {patches.__name__.rpartition(".")[0]} import {patches.__name__.rpartition(".")[2]} as reg
"""


def _all_called(tmp_path: Path, extra: str) -> list[CallSite]:
    """A module calling every registered patch by its constant (as the workflow does), plus ``extra``."""
    lines = [REAL, *(f"workflow.patched(reg.{n})" for n in registry_constants()), extra]
    return _code(tmp_path, "\n".join(lines))


def _today_ok() -> date:
    return min(p.needed_until for p in PATCHES)


def test_a_complete_registry_and_code_pass(tmp_path: Path) -> None:
    assert problems(PATCHES, registry_constants(), _all_called(tmp_path, ""), _today_ok()) == []


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('workflow.patched("cancellation-state-machine")', "does not name a constant"),
        ('import temporalio.workflow\ntemporalio.workflow.patched("new-thing")', "does not name a constant"),
        ("from temporalio.workflow import patched as p\np(SOMETHING)", "does not name a constant"),
        ("workflow.deprecate_patch(CANCELLATION_PATCH)", "whose registered stage is active"),
        ("workflow.patched(BASE)\nworkflow.patched()", "does not name a constant"),
        ("check = workflow.patched\ncheck(BASE)", "handed on as a value"),
        ("from temporalio.workflow import patched\nhooks = {'patched': patched}", "handed on as a value"),
    ],
)
def test_a_call_naming_no_registered_constant_fails(tmp_path: Path, extra: str, expected: str) -> None:
    found = problems(PATCHES, registry_constants(), _all_called(tmp_path, extra), _today_ok())
    assert len(found) == 1 and expected in found[0], found


def test_a_patch_without_a_fixture_or_with_one_not_recording_it_fails(tmp_path: Path) -> None:
    sites = _all_called(tmp_path, "")
    first, *rest = PATCHES
    for broken, expected in [
        (Patch(first.id, first.why, fixtures=(), shipped=first.shipped), "names no recorded history"),
        (Patch(first.id, first.why, fixtures=("no-such-run",), shipped=first.shipped), "no-such-run.json is not in"),
        # A history recorded before every patch: it holds no marker at all.
        (Patch(first.id, first.why, fixtures=("happy-path",), shipped=first.shipped), "does not record its marker"),
    ]:
        found = problems((broken, *rest), registry_constants(), sites, _today_ok())
        assert len(found) == 1 and expected in found[0], found
    assert recorded_markers(HISTORIES / "happy-path.json") == {}


def test_a_run_context_passing_its_parameter_on_is_checked_at_its_callers(tmp_path: Path) -> None:
    """A phase asks its run context whether a patch is on; the context's own call passes a parameter on, and
    what its callers pass is what must be a registered constant."""
    wrapper = """
class RunContext:
    def patch_on(self, patch_id: str) -> bool:
        return workflow.patched(patch_id)
"""
    sites = _all_called(tmp_path, wrapper + "ctx = RunContext()\nctx.patch_on(BASE)\n")
    assert problems(PATCHES, registry_constants(), sites, _today_ok()) == []
    assert [s.argument for s in sites if s.constant == "BASELINE_PATCH"] == ["reg.BASELINE_PATCH", "BASE"]
    assert "patch_id" not in [s.argument for s in sites]
    sites = _code(tmp_path / "again", REAL + wrapper + 'ctx = RunContext()\nctx.patch_on("baseline-tests")\n')
    assert [(s.call, s.constant, s.argument) for s in sites] == [("patched", None, "'baseline-tests'")]


def test_a_duplicate_a_missing_entry_or_an_uncalled_patch_fails(tmp_path: Path) -> None:
    sites = _all_called(tmp_path, "")
    first, second, *rest = PATCHES
    found = problems((*PATCHES, first), registry_constants(), sites, _today_ok())
    assert found == [f"ID {first.id!r} is registered 2 times"], found
    found = problems((second, *rest), registry_constants(), sites, _today_ok())
    assert len(found) == 1 and f"= {first.id!r} has no registry entry" in found[0], found
    constants = {**registry_constants(), "NEW_PATCH": "never-registered"}
    found = problems(PATCHES, constants, sites, _today_ok())
    assert found == ["NEW_PATCH = 'never-registered' has no registry entry"]
    uncalled = [s for s in sites if registry_constants().get(s.constant or "") != second.id]
    found = problems(PATCHES, registry_constants(), uncalled, _today_ok())
    assert len(found) == 1 and f"patch {second.id!r} is active but no code" in found[0], found


def test_an_active_patch_past_its_date_fails_saying_to_deprecate_it(tmp_path: Path) -> None:
    sites = _all_called(tmp_path, "")
    oldest = min(PATCHES, key=lambda p: p.needed_until)
    found = problems(PATCHES, registry_constants(), sites, oldest.needed_until + timedelta(days=1))
    assert found and all("deprecate it" in f for f in found), found
    assert any(f"patch {oldest.id!r} shipped {oldest.shipped}" in f for f in found), found
