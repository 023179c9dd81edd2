"""Drafting a reproduction from a bug report's prose, when the report carries no ``durafix-repro`` block.

The model gets the report, the kinds of reproduction it may write (:class:`~environments.reproduction.
ReproductionKind`: a browser procedure only when the recipe serves an app, a ``test`` only when the recipe
can run named tests), short facts about the repository (:class:`RepositoryFacts`) and a description of every
kind's schema (generated from the models that validate it, so it cannot drift), and answers with one call
``submit_procedure(yaml)``. The YAML is validated with :func:`environments.reproduction.parse_reproduction`
and held to the kinds offered; a refusal (its line included) goes back to the model as the tool's result and
it gets another round, up to ``max_rounds`` model responses in one call. The first valid reproduction ends it.

Earlier rounds whose draft was valid but refused once it ran on the base revision (it did not show the bug)
are given back as :class:`DraftRound`: the conversation is rebuilt from the inputs on every call (system, the
report, then per earlier round the model's submission and what the run on the base found), so the same
inputs send the same messages, and a workflow can loop draft / run / refuse with each step recorded.

Trust: the report is untrusted text and so is whatever the model makes of it. The reproduction is held to the
same closed schema as one written by the reporter (paths confined to the app's base URL or the workspace,
regexes compiled at validation), so a drafted reproduction can do nothing a hand-written one could not; its
commands and tests run only in the sandbox.

Contract: ``draft`` is not idempotent at the model (asking again may get another reproduction and spends
tokens again) and has no effect besides model requests, each carrying the caller's operation ID in the
``X-Durafix-Op-Id`` header. The caller stores a completed draft by content and records its reference under
the operation ID, so a completed draft is never asked for again; a draft that failed may simply be asked
for again. Endpoint failures are classified by :mod:`repair.openai_calls`, as for the repair engine (the SDK
does not retry; :class:`~repair.interface.ModelTransientError` carries ``retry_after``), and every failure
carries the tokens spent before it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from browser.procedure import Procedure, ProcedureError
from environments.interface import AppRecipe
from environments.reproduction import (
    CommandProcedure,
    Reproduction,
    ReproductionKind,
    TestProcedure,
    kind_of,
    parse_reproduction,
)
from environments.test_files import pick_test_files
from repair.config import ModelConfig
from repair.interface import RepairError
from repair.openai_calls import ChatEndpoint, TokenUsage, assistant_param, first_message, function_calls

if TYPE_CHECKING:  # the SDK's types only (repair/openai_calls.py says why the SDK is imported late)
    from openai.types.chat import (
        ChatCompletionFunctionToolParam,
        ChatCompletionMessageFunctionToolCall,
        ChatCompletionMessageParam,
    )

TASK_MARKER = "durafix-task: draft-procedure"
SUBMIT = "submit_procedure"
# The kinds a caller that says nothing offers: a browser procedure, as before other kinds existed.
BROWSER_ONLY: tuple[ReproductionKind, ...] = (ReproductionKind.BROWSER,)
# How much of the repository's listing the prompt shows: enough to name a runnable path, never the whole tree.
MAX_FACT_PATHS = 60

_SUBMIT_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": SUBMIT,
        "description": "Submit the whole reproduction as YAML. durafix validates it and answers with the error "
        "(and its line) when it is not valid, or with what running it on the base revision found when it did "
        "not show the bug.",
        "parameters": {
            "type": "object",
            "properties": {"yaml": {"type": "string", "description": "the whole reproduction, as YAML"}},
            "required": ["yaml"],
            "additionalProperties": False,
        },
    },
}

EXAMPLE_PROCEDURE = """\
version: 1
name: search finds nothing for a product that exists
steps:
  - {action: goto, path: /search}
  - {action: fill, selector: "#q", value: teapot}
  - {action: press, selector: "#q", key: Enter}
  - {action: wait_for, selector: "#results"}
bug_present:
  - {action: expect_text, selector: "#results", contains: No results}
"""

EXAMPLE_COMMAND = """\
version: 1
kind: command
name: slugify keeps the trailing dash of a title ending in punctuation
files:
  repro/slug.py: |
    import sys
    sys.path.insert(0, ".")
    from textkit import slugify
    print(slugify("Hello, world!"))
steps:
  - {run: python3 repro/slug.py, timeout_s: 60}
bug_present:
  - {check: exit_status, equals: "0"}
  - {check: stdout, not_equals: hello-world}
"""

EXAMPLE_TEST = """\
version: 1
kind: test
name: parse_duration rejects "1h30m"
files:
  tests/test_issue_parse_duration.py: |
    from timetools import parse_duration


    def test_hours_and_minutes_together():
        assert parse_duration("1h30m") == 5400
tests:
  - tests/test_issue_parse_duration.py
"""

_EXAMPLES = {
    ReproductionKind.BROWSER: EXAMPLE_PROCEDURE,
    ReproductionKind.COMMAND: EXAMPLE_COMMAND,
    ReproductionKind.TEST: EXAMPLE_TEST,
}

_INTRO = """You are durafix's reproduction author. A bug report follows. Write the reproduction that shows the \
bug: durafix runs it on the repository's current code (the revision the report is about) and accepts it only \
if it shows the bug there; once the bug is fixed it must stop showing it. Commands and tests run in a sandbox \
without network, in the repository's root, after the recipe's setup."""

_CHOOSING = {
    ReproductionKind.TEST: "- test (`kind: test`): prefer it when the bug is in library code a test can reach: "
    "the test then becomes the regression test of the fix, in its pull request. Write the test file with "
    "`files` at a path the project's test conventions find (e.g. tests/test_issue_<n>.py, or "
    "test/issue-<n>.test.js), in the project's own test framework, and name it in `tests` (a file, or a test "
    "ID such as tests/test_issue_7.py::test_total, as the named-tests command below takes it). The test must "
    "FAIL while the bug is present and PASS once it is fixed: assert the correct behaviour the report expects, "
    "not the wrong one it sees.",
    ReproductionKind.COMMAND: "- command (`kind: command`): when the bug shows in a program's output (a command "
    "line tool, a script's result, an error it prints). The steps run one after another by /bin/sh; every "
    "step but the last must exit 0, and bug_present judges what the last one left (its exit status, stdout, "
    "stderr or a file). A small script it needs can be written with `files`. Prefer checks that the correct "
    "output is absent (not_equals the expected value) over matching one particular wrong value.",
    ReproductionKind.BROWSER: "- browser (no `kind`): only for a page of the served app. You do not know the "
    'app\'s address: every path is relative to its base URL and starts with a single "/". Use only pages, '
    "selectors and texts that the report names or clearly implies; do not invent others. Prefer asserting "
    "that the correct behaviour is absent (e.g. not_equals the expected value) over matching one particular "
    "wrong value, and wait for an element before asserting on it. bug_present assertions must ALL hold while "
    "the bug is present.",
}

_ANSWER = """Answer with exactly one call to {submit}, its yaml argument the whole reproduction. If durafix \
answers with an error, or says that your reproduction did not show the bug when it ran, fix that and submit \
the whole reproduction again."""


class RepositoryFacts(BaseModel):
    """What a drafter needs to know of the repository to write a command or a test that runs there; the caller
    fills it from the recipe and the checkout. Paths are the repository's own (untrusted) names: the prompt
    quotes them as data."""

    ecosystem: str = Field(default="", description="e.g. python, javascript; empty when unknown")
    test_command: str | None = Field(default=None, description="the recipe's `test`")
    test_subset: str | None = Field(default=None, description="the recipe's `test_subset` ({files} or {ids})")
    top_level: list[str] = Field(default_factory=list, description="the repository's top-level entries")
    test_files: list[str] = Field(default_factory=list, description="paths of the repository's test files")

    def render(self) -> str:
        """The facts as prompt lines; empty when there are none."""
        lines = []
        if self.ecosystem:
            lines.append(f"- ecosystem: {self.ecosystem}")
        if self.test_command:
            lines.append(f"- the tests run with: {json.dumps(self.test_command)}")
        if self.test_subset:
            lines.append(
                f"- named tests run with: {json.dumps(self.test_subset)} ({{files}} or {{ids}} stands for the "
                "tests a test reproduction names)"
            )
        for label, paths in (("top-level files", self.top_level), ("test files", self.test_files)):
            if paths:
                shown = ", ".join(json.dumps(p) for p in paths[:MAX_FACT_PATHS])
                more = f" and {len(paths) - MAX_FACT_PATHS} more" if len(paths) > MAX_FACT_PATHS else ""
                lines.append(f"- {label}: {shown}{more}")
        return "\n".join(lines)


class DraftRound(BaseModel):
    """An earlier round whose draft was valid but was refused once it ran: the YAML the model submitted, and
    what the run on the base found (e.g. ``ran on the base revision: not reproduced: ...``)."""

    yaml: str
    refusal: str = Field(min_length=1)


class DraftResult(BaseModel):
    procedure_yaml: str = Field(description="the YAML the model submitted, exactly as validated")
    procedure: Reproduction
    kind: ReproductionKind
    rounds: int = Field(ge=1, description="model responses it took in this call, the accepted one included")
    prompt_tokens: int
    completion_tokens: int
    model: str = Field(description="the model that answered, as the endpoint named it")


class ProcedureDraftError(RepairError):
    """The model never submitted a valid reproduction within ``max_rounds``; ``last_error`` says why the last
    answer was refused. Asking again starts a new conversation; the caller decides whether that is worth it."""

    def __init__(
        self, message: str, *, rounds: int, last_error: str, prompt_tokens: int, completion_tokens: int
    ) -> None:
        super().__init__(message, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        self.rounds = rounds
        self.last_error = last_error


class ProcedureDrafter:
    """Drafts reproductions through any OpenAI-compatible chat-completions endpoint (tool calling and ``usage``
    required). See the module docstring for the contract."""

    def __init__(self, base_url: str, api_key: str, model: str, timeout_s: float, max_retries: int = 0) -> None:
        self._endpoint = ChatEndpoint(base_url, api_key, model, timeout_s, max_retries)

    @classmethod
    def from_config(cls, config: ModelConfig) -> ProcedureDrafter:
        return cls(config.base_url, config.api_key, config.model, config.timeout_s)

    def draft(
        self,
        title: str,
        body: str,
        op_id: str,
        *,
        kinds: Sequence[ReproductionKind] = BROWSER_ONLY,
        facts: RepositoryFacts | None = None,
        previous: Sequence[DraftRound] = (),
        max_rounds: int = 3,
    ) -> DraftResult:
        """The first valid reproduction of one of ``kinds`` the model submits for the report ``title`` /
        ``body``, told the repository's ``facts`` and, as earlier turns of the conversation, the ``previous``
        rounds that ran and were refused.

        Raises ProcedureDraftError when ``max_rounds`` responses brought none, ModelTransientError or
        ModelPermanentError when the endpoint fails or answers unusably.
        """
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be at least 1, got {max_rounds}")
        offered = _offered(kinds)
        messages = conversation(title, body, kinds=offered, facts=facts, previous=previous)
        usage = TokenUsage()
        refusal = ""
        for round_ in range(1, max_rounds + 1):
            completion = self._endpoint.complete(
                messages, tools=[_SUBMIT_TOOL], tool_choice="required", op_id=op_id, usage=usage
            )
            message = first_message(completion, usage)
            calls = function_calls(message, usage)
            messages.append(assistant_param(message, calls))
            if not calls:
                refusal = f"the answer made no tool call; call {SUBMIT} with the whole reproduction"
                messages.append({"role": "user", "content": f"error: {refusal}"})
                continue
            submitted, refusal = _judge(calls, offered)
            if submitted is not None:
                text, reproduction = submitted
                return DraftResult(
                    procedure_yaml=text,
                    procedure=reproduction,
                    kind=kind_of(reproduction),
                    rounds=round_,
                    prompt_tokens=usage.prompt,
                    completion_tokens=usage.completion,
                    model=completion.model,
                )
            # Every tool call needs its own answer, or a strict endpoint refuses the next request.
            messages += [{"role": "tool", "tool_call_id": c.id, "content": f"error: {refusal}"} for c in calls]
        raise ProcedureDraftError(
            f"the model submitted no valid reproduction in {max_rounds} rounds; the last answer: {refusal}",
            rounds=max_rounds,
            last_error=refusal,
            **usage.spent(),
        )


def available_kinds(*, serves_app: bool, runs_named_tests: bool) -> tuple[ReproductionKind, ...]:
    """The kinds a recipe can run: a browser procedure when it serves an app (declares ``start``), a command
    always, a test when it can run named tests (declares ``test_subset``)."""
    kinds = [ReproductionKind.BROWSER] if serves_app else []
    kinds.append(ReproductionKind.COMMAND)
    if runs_named_tests:
        kinds.append(ReproductionKind.TEST)
    return tuple(kinds)


# A marker file at the repository's root, and the ecosystem it names (the first found, in this order).
_ECOSYSTEMS = (
    ("pyproject.toml", "python"),
    ("setup.py", "python"),
    ("requirements.txt", "python"),
    ("package.json", "javascript"),
    ("go.mod", "go"),
    ("Cargo.toml", "rust"),
    ("Gemfile", "ruby"),
    ("pom.xml", "java"),
    ("build.gradle", "java"),
)


def recipe_kinds(recipe: AppRecipe) -> tuple[ReproductionKind, ...]:
    """:func:`available_kinds` for a repository's recipe."""
    return available_kinds(serves_app=bool(recipe.start), runs_named_tests=recipe.test_subset is not None)


def repository_facts(recipe: AppRecipe, paths: Sequence[str]) -> RepositoryFacts:
    """The facts a drafter is told, from the recipe and the repository's tracked ``paths`` (as git lists them
    at the base revision: names only, no file is read). Top-level entries and test files are sorted, so the
    same checkout gives the same facts; the prompt shows at most :data:`MAX_FACT_PATHS` of each."""
    top = sorted({p.split("/", 1)[0] + ("/" if "/" in p else "") for p in paths})
    names = {t.rstrip("/") for t in top}
    ecosystem = next((name for marker, name in _ECOSYSTEMS if marker in names), "")
    return RepositoryFacts(
        ecosystem=ecosystem,
        test_command=recipe.test,
        test_subset=recipe.test_subset,
        top_level=top,
        test_files=pick_test_files(paths, recipe.test_files),
    )


def conversation(
    title: str,
    body: str,
    *,
    kinds: Sequence[ReproductionKind] = BROWSER_ONLY,
    facts: RepositoryFacts | None = None,
    previous: Sequence[DraftRound] = (),
) -> list[ChatCompletionMessageParam]:
    """The messages a draft starts from: the system prompt, the report, and per earlier round the model's
    submission and what running it found. A function of its inputs only (tool call IDs included)."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": system_prompt(kinds, facts)},
        {"role": "user", "content": f"Bug report: {title}\n\n{body.strip()}"},
    ]
    for n, earlier in enumerate(previous, 1):
        call_id = f"draft-round-{n}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": SUBMIT, "arguments": json.dumps({"yaml": earlier.yaml})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"error: {earlier.refusal}"})
    return messages


def system_prompt(kinds: Sequence[ReproductionKind] = BROWSER_ONLY, facts: RepositoryFacts | None = None) -> str:
    """The drafting instructions for ``kinds``, the repository's ``facts``, the schema of every kind offered,
    an example of each, and the ``durafix-task: draft-procedure`` marker line."""
    offered = _offered(kinds)
    names = ", ".join(k.value for k in offered)
    parts = [
        _INTRO,
        f"The kinds you may write here: {names}. How to choose:",
        "\n".join(_CHOOSING[k] for k in _CHOOSING if k in offered),
        _ANSWER.format(submit=SUBMIT),
    ]
    rendered = facts.render() if facts is not None else ""
    if rendered:
        parts.append(f"The repository (names quoted as found):\n{rendered}")
    parts.append(schema_summary(offered))
    examples = [f"A {k.value} reproduction:\n```yaml\n{_EXAMPLES[k]}```" for k in _CHOOSING if k in offered]
    parts.append("Examples (for other projects):\n\n" + "\n\n".join(examples))
    parts.append(TASK_MARKER)
    return "\n\n".join(parts)


def _offered(kinds: Sequence[ReproductionKind]) -> tuple[ReproductionKind, ...]:
    """``kinds`` without repeats, in a fixed order (so the prompt does not depend on the caller's order)."""
    offered = tuple(k for k in ReproductionKind if k in kinds)
    if not offered:
        raise ValueError("at least one kind of reproduction must be offered")
    return offered


def schema_summary(kinds: Sequence[ReproductionKind] = tuple(ReproductionKind)) -> str:
    """A compact description of every shape of the ``kinds`` given, generated from the pydantic models' JSON
    schema. Rules that the JSON schema cannot express (validators) are stated by hand after each kind."""
    offered = _offered(kinds)
    sections = []
    if ReproductionKind.BROWSER in offered:
        sections.append(_browser_summary())
    if ReproductionKind.COMMAND in offered:
        sections.append(_command_summary())
    if ReproductionKind.TEST in offered:
        sections.append(_test_summary())
    return "\n\n".join(sections)


def _browser_summary() -> str:
    schema = Procedure.model_json_schema()
    props: dict[str, Any] = schema["properties"]
    shapes: dict[str, Any] = schema["$defs"]
    step_tags: dict[str, str] = props["steps"]["items"]["discriminator"]["mapping"]
    assertion_tags: dict[str, str] = props["bug_present"]["items"]["discriminator"]["mapping"]
    lines = ["A browser procedure is a YAML mapping without `kind` (unknown keys are errors):"]
    lines += [f"  {name}: {_describe(prop, name in schema['required'])}" for name, prop in props.items()]
    lines += ["", "Step shapes (each a mapping with its `action`; unknown keys are errors):"]
    for tag, ref in step_tags.items():
        shape = shapes[ref.rsplit("/", 1)[1]]
        required = shape["required"]
        fields = [f"{k}: {_describe(p, k in required)}" for k, p in shape["properties"].items() if k != "action"]
        lines.append("; ".join([f"  - action: {tag}", *fields]))
        if "description" in shape:
            lines.append(f"    ({_prose(shape['description'])})")
    lines += [
        "",
        f"bug_present takes only: {', '.join(assertion_tags)}.",
        "An expect_* step is a checkpoint the page must reach (polled up to timeout_ms); in bug_present the "
        "same shape is judged once, after the steps.",
        'Every path starts with a single "/" and is relative to the app\'s base URL; other hosts are refused.',
        'A selector is a Playwright selector, e.g. CSS "#total" or "text=Checkout".',
        "expect_text takes exactly one of equals, not_equals, contains, matches (a Python regular expression "
        "searched in the text).",
    ]
    return "\n".join(lines)


def _command_summary() -> str:
    schema = CommandProcedure.model_json_schema()
    shapes: dict[str, Any] = schema["$defs"]
    lines = [
        "A command reproduction is a YAML mapping (unknown keys are errors):",
        *_fields(schema, skip=("app",)),
        "",
        "Each of steps is a mapping: " + "; ".join(_fields(shapes["CommandStep"], indent="")),
        f"  ({_prose(shapes['CommandStep']['description'])})",
        "Each of bug_present is a mapping: " + "; ".join(_fields(shapes["OutputCheck"], indent="")),
        f"  ({_prose(shapes['OutputCheck']['description'])})",
        "",
        "A check takes exactly one of equals, not_equals, contains, matches; `path` is given with `check: file` "
        "and only then. Every path in files is relative to the repository root, plain (no '.', '..' or empty "
        "parts) and outside .git; files are written before the first step.",
    ]
    return "\n".join(lines)


def _test_summary() -> str:
    schema = TestProcedure.model_json_schema()
    lines = [
        "A test reproduction is a YAML mapping (unknown keys are errors):",
        *_fields(schema),
        f"  ({_prose(schema['description'])})",
        "",
        "Every path in files is relative to the repository root, plain (no '.', '..' or empty parts) and outside "
        ".git; a test is a file or a test ID, never an option. When you write a test file with files, name it "
        "(or its tests) in tests.",
    ]
    return "\n".join(lines)


def _fields(shape: dict[str, Any], *, skip: tuple[str, ...] = (), indent: str = "  ") -> list[str]:
    required = shape.get("required", [])
    return [f"{indent}{k}: {_describe(p, k in required)}" for k, p in shape["properties"].items() if k not in skip]


def _prose(text: str) -> str:
    return " ".join(text.replace("``", "`").split())


def _describe(prop: dict[str, Any], required: bool) -> str:
    """``prop`` (one JSON-schema property) as ``type, bounds, required | default``."""
    parts = [_type_name(prop)]
    bounds = _bounds(prop)
    if bounds:
        parts.append(bounds)
    if required:
        parts.append("required")
    elif prop.get("default") not in (None, {}, []):
        parts.append(f"default {json.dumps(prop['default'])}")
    else:
        parts.append("optional")
    return ", ".join(parts)


def _type_name(prop: dict[str, Any]) -> str:
    if "const" in prop:
        return json.dumps(prop["const"])
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "anyOf" in prop:
        return " | ".join(_type_name(p) for p in prop["anyOf"] if p.get("type") != "null")
    if prop.get("type") == "array":
        items = prop.get("items", {})
        return f"list of {items['type']}s" if items.get("type") in ("string", "integer") else "list of the shapes below"
    if prop.get("type") == "object":
        return "mapping of file path -> file text"
    return str(prop.get("type", "any"))


_BOUNDS = (
    ("minLength", "maxLength", " chars"),
    ("minItems", "maxItems", " items"),
    ("minProperties", "maxProperties", " entries"),
    ("minimum", "maximum", ""),
)


def _bounds(prop: dict[str, Any]) -> str:
    for low, high, unit in _BOUNDS:
        if low in prop and high in prop:
            return f"{prop[low]}..{prop[high]}{unit}"
        if high in prop:
            return f"at most {prop[high]}{unit}"
        if low in prop:
            return f"at least {prop[low]}{unit}"
    return ""


_UNAVAILABLE = {
    ReproductionKind.BROWSER: "the repository's recipe serves no app (it declares no start command), so there "
    "is no page to open",
    ReproductionKind.COMMAND: "command reproductions are not offered here",
    ReproductionKind.TEST: "the repository's recipe declares no test_subset, so named tests cannot be run",
}


def _judge(
    calls: list[ChatCompletionMessageFunctionToolCall], kinds: Sequence[ReproductionKind]
) -> tuple[tuple[str, Reproduction] | None, str]:
    """The submitted YAML and its reproduction when the answer is one valid submission of a kind offered,
    else why it is not."""
    if len(calls) != 1:
        return None, f"answer with exactly one {SUBMIT} call (this answer made {len(calls)})"
    call = calls[0]
    if call.function.name != SUBMIT:
        return None, f"unknown tool {call.function.name!r}; the only tool is {SUBMIT}"
    try:
        args = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as e:
        return None, f'the arguments are not JSON ({e.msg}); send {{"yaml": "..."}}'
    if not isinstance(args, dict) or set(args) != {"yaml"} or not isinstance(args["yaml"], str):
        return None, 'the arguments must be exactly {"yaml": "<the whole reproduction>"}'
    try:
        reproduction = parse_reproduction(args["yaml"])
    except ProcedureError as e:
        return None, f"the reproduction is not valid: {e}"
    kind = kind_of(reproduction)
    if kind not in kinds:
        offered = ", ".join(k.value for k in kinds)
        return None, f"a {kind.value} reproduction cannot run here: {_UNAVAILABLE[kind]}; write one of: {offered}"
    if isinstance(reproduction, CommandProcedure) and reproduction.app and ReproductionKind.BROWSER not in kinds:
        # Said now rather than by a run whose provisioning could only fail: no app, nothing to run it against.
        return None, (
            "a command reproduction with `app: true` cannot run here: the repository's recipe serves no app (it "
            "declares no start command); write commands that run without the app (leave `app` out)"
        )
    if isinstance(reproduction, TestProcedure) and reproduction.files and not _names_a_file(reproduction):
        return None, (
            "the test reproduction writes files but its tests name none of them: name the test file you wrote "
            f"(or a test ID in it) in tests (files: {', '.join(sorted(reproduction.files))})"
        )
    return (args["yaml"], reproduction), ""


def _names_a_file(test: TestProcedure) -> bool:
    """Whether some entry of ``tests`` is one of the files written, or a test ID in one (``path::name``,
    ``path:name`` ...): the file then runs, and travels into the repair as the regression test."""
    return any(t == path or (t.startswith(path) and t[len(path)] in ": ") for t in test.tests for path in test.files)
