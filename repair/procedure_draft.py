"""Drafting a reproduction procedure from a bug report's prose, when the report carries no ``durafix-repro`` block.

The model gets the report and a description of the procedure schema (generated from
:class:`browser.procedure.Procedure`, so it cannot drift from what is validated) and answers with one call
``submit_procedure(yaml)``. The YAML is validated with :func:`browser.procedure.parse_procedure`; a refusal
(its line included) goes back to the model as the tool's result and it gets another round, up to
``max_rounds`` model responses in all. The first valid procedure ends the conversation.

Trust: the report is untrusted text and so is whatever the model makes of it. The procedure is held to the
same closed schema as one written by the reporter (paths confined to the app's base URL, regexes compiled
at validation), so a drafted procedure can do nothing a hand-written one could not.

Contract: ``draft`` is not idempotent at the model (asking again may get another procedure and spends tokens
again) and has no effect besides model requests, each carrying the caller's operation ID in the
``X-Durafix-Op-Id`` header. The caller stores a completed draft by content and records its reference under
the operation ID, so a completed draft is never asked for again; a draft that failed may simply be asked
for again. Endpoint failures are classified by :mod:`repair.openai_calls`, as for the repair engine (the SDK
does not retry; :class:`~repair.interface.ModelTransientError` carries ``retry_after``), and every failure
carries the tokens spent before it.
"""

from __future__ import annotations

import json
from typing import Any

from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)
from pydantic import BaseModel, Field

from browser.procedure import Procedure, ProcedureError, parse_procedure
from repair.config import ModelConfig
from repair.interface import RepairError
from repair.openai_calls import ChatEndpoint, TokenUsage, assistant_param, first_message, function_calls

TASK_MARKER = "durafix-task: draft-procedure"
SUBMIT = "submit_procedure"

_SUBMIT_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": SUBMIT,
        "description": "Submit the whole reproduction procedure as YAML. durafix validates it and answers "
        "with the error (and its line) when it is not valid.",
        "parameters": {
            "type": "object",
            "properties": {"yaml": {"type": "string", "description": "the whole procedure, as YAML"}},
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

_SYSTEM = """You are durafix's reproduction author. A bug report about a web application follows. Write the \
browser procedure that shows the bug: steps that bring a fresh page to the state where the bug shows, and \
assertions (bug_present) that ALL hold while the bug is present and stop holding once it is fixed.

How to write it:
- You do not know the app's address: every path is relative to its base URL and starts with a single "/".
- Use only pages, selectors and texts that the report names or clearly implies; do not invent others.
- Prefer asserting that the correct behaviour is absent (e.g. not_equals the expected value) over matching \
one particular wrong value, and wait for an element before asserting on it.
- Answer with exactly one call to {submit}, its yaml argument the whole procedure. If durafix answers with an \
error, fix that and submit the whole procedure again.

{schema}

An example (for another app):
```yaml
{example}```

{marker}"""


class DraftResult(BaseModel):
    procedure_yaml: str = Field(description="the YAML the model submitted, exactly as validated")
    procedure: Procedure
    rounds: int = Field(ge=1, description="model responses it took, the accepted one included")
    prompt_tokens: int
    completion_tokens: int
    model: str = Field(description="the model that answered, as the endpoint named it")


class ProcedureDraftError(RepairError):
    """The model never submitted a valid procedure within ``max_rounds``; ``last_error`` says why the last
    answer was refused. Asking again starts a new conversation; the caller decides whether that is worth it."""

    def __init__(
        self, message: str, *, rounds: int, last_error: str, prompt_tokens: int, completion_tokens: int
    ) -> None:
        super().__init__(message, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        self.rounds = rounds
        self.last_error = last_error


class ProcedureDrafter:
    """Drafts procedures through any OpenAI-compatible chat-completions endpoint (tool calling and ``usage``
    required). See the module docstring for the contract."""

    def __init__(self, base_url: str, api_key: str, model: str, timeout_s: float, max_retries: int = 0) -> None:
        self._endpoint = ChatEndpoint(base_url, api_key, model, timeout_s, max_retries)

    @classmethod
    def from_config(cls, config: ModelConfig) -> ProcedureDrafter:
        return cls(config.base_url, config.api_key, config.model, config.timeout_s)

    def draft(self, title: str, body: str, op_id: str, *, max_rounds: int = 3) -> DraftResult:
        """The first valid procedure the model submits for the report ``title`` / ``body``.

        Raises ProcedureDraftError when ``max_rounds`` responses brought none, ModelTransientError or
        ModelPermanentError when the endpoint fails or answers unusably.
        """
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be at least 1, got {max_rounds}")
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system_prompt()},
            {"role": "user", "content": f"Bug report: {title}\n\n{body.strip()}"},
        ]
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
                refusal = f"the answer made no tool call; call {SUBMIT} with the whole procedure"
                messages.append({"role": "user", "content": f"error: {refusal}"})
                continue
            submitted, refusal = _judge(calls)
            if submitted is not None:
                text, procedure = submitted
                return DraftResult(
                    procedure_yaml=text,
                    procedure=procedure,
                    rounds=round_,
                    prompt_tokens=usage.prompt,
                    completion_tokens=usage.completion,
                    model=completion.model,
                )
            # Every tool call needs its own answer, or a strict endpoint refuses the next request.
            messages += [{"role": "tool", "tool_call_id": c.id, "content": f"error: {refusal}"} for c in calls]
        raise ProcedureDraftError(
            f"the model submitted no valid procedure in {max_rounds} rounds; the last answer: {refusal}",
            rounds=max_rounds,
            last_error=refusal,
            **usage.spent(),
        )


def draft_procedure(config: ModelConfig, title: str, body: str, *, op_id: str, max_rounds: int = 3) -> DraftResult:
    """:meth:`ProcedureDrafter.draft` on the endpoint ``config`` names."""
    return ProcedureDrafter.from_config(config).draft(title, body, op_id, max_rounds=max_rounds)


def system_prompt() -> str:
    """The drafting instructions, the schema and the ``durafix-task: draft-procedure`` marker line."""
    return _SYSTEM.format(submit=SUBMIT, schema=schema_summary(), example=EXAMPLE_PROCEDURE, marker=TASK_MARKER)


def schema_summary() -> str:
    """A compact description of every procedure shape, generated from the pydantic models' JSON schema.

    Rules that the JSON schema cannot express (validators) are stated by hand at the end.
    """
    schema = Procedure.model_json_schema()
    props: dict[str, Any] = schema["properties"]
    shapes: dict[str, Any] = schema["$defs"]
    step_tags: dict[str, str] = props["steps"]["items"]["discriminator"]["mapping"]
    assertion_tags: dict[str, str] = props["bug_present"]["items"]["discriminator"]["mapping"]
    lines = ["The procedure is a YAML mapping (unknown keys are errors):"]
    lines += [f"  {name}: {_describe(prop, name in schema['required'])}" for name, prop in props.items()]
    lines += ["", "Step shapes (each a mapping with its `action`; unknown keys are errors):"]
    for tag, ref in step_tags.items():
        shape = shapes[ref.rsplit("/", 1)[1]]
        required = shape["required"]
        fields = [f"{k}: {_describe(p, k in required)}" for k, p in shape["properties"].items() if k != "action"]
        lines.append("; ".join([f"  - action: {tag}", *fields]))
        if "description" in shape:
            lines.append(f"    ({' '.join(shape['description'].replace('``', '`').split())})")
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


def _describe(prop: dict[str, Any], required: bool) -> str:
    """``prop`` (one JSON-schema property) as ``type, bounds, required | default``."""
    parts = [_type_name(prop)]
    bounds = _bounds(prop)
    if bounds:
        parts.append(bounds)
    if required:
        parts.append("required")
    elif prop.get("default") is not None:
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
        return "list of the shapes below"
    return str(prop.get("type", "any"))


_BOUNDS = (("minLength", "maxLength", " chars"), ("minItems", "maxItems", " items"), ("minimum", "maximum", ""))


def _bounds(prop: dict[str, Any]) -> str:
    for low, high, unit in _BOUNDS:
        if low in prop and high in prop:
            return f"{prop[low]}..{prop[high]}{unit}"
        if high in prop:
            return f"at most {prop[high]}{unit}"
        if low in prop:
            return f"at least {prop[low]}{unit}"
    return ""


def _judge(calls: list[ChatCompletionMessageFunctionToolCall]) -> tuple[tuple[str, Procedure] | None, str]:
    """The submitted YAML and its procedure when the answer is one valid submission, else why it is not."""
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
        return None, 'the arguments must be exactly {"yaml": "<the whole procedure>"}'
    try:
        return (args["yaml"], parse_procedure(args["yaml"])), ""
    except ProcedureError as e:
        return None, f"the procedure is not valid: {e}"
