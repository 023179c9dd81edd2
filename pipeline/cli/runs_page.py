"""``durafix serve``'s runs page: ``GET /runs`` (every run, filtered by repository and outcome) and
``GET /runs/<run>`` (one run's timeline), read-only HTML without JavaScript.

Contracts:

- **Access** needs the operator's token (``DURAFIX_OPERATOR_TOKEN``): ``Authorization: Bearer <token>``, or a
  link signed with it (``?sig=...&exp=...``, :class:`evidence.links.LinkSigner` over the path, as evidence
  links are signed; :func:`signed_runs_link` makes one). Anything else, and everything while no token is
  configured, is ``401``, before Temporal is asked anything. The page's own links (a run's page, the filter
  form) are signed afresh, valid :data:`LINK_TTL_S`.
- **Everything shown is escaped** (run names, report titles, branch names, failure messages are written by
  others); a link is only made of an ``http``/``https`` URL, else the text is shown unlinked.
- **Headers**: a Content-Security-Policy that allows nothing but the page's one stylesheet (by its hash) and
  its own form (``default-src 'none'``, no script, no frame, no base), ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: no-referrer`` (a signed URL never leaves in a Referer), ``Cache-Control: no-store``.
- The facts come from :mod:`pipeline.cli.runs_view`; Temporal unreachable is ``503``, an unknown run ``404``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from html import escape
from typing import Protocol, TypeVar
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from evidence.links import EXP, SIG, LinkSigner
from pipeline.cli.runs_view import RunDetail, RunRow, age, list_runs, run_detail
from pipeline.config import DurafixConfig

T = TypeVar("T")


class WithClient(Protocol):
    """Runs ``fn`` with the server's Temporal client (on the loop that client lives on) and gives its result."""

    def __call__(self, fn: Callable[[Client], Awaitable[T]], /) -> Awaitable[T]: ...


LINK_TTL_S = 3600
RUNNING = "running"
STYLE = (
    "body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}"
    ".failed{color:#a00}.merged{color:#070}nav a{margin-right:1em}"
)
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CSP = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Connection": "close",
}


def signed_runs_link(config: DurafixConfig, base_url: str, *, valid_s: int = LINK_TTL_S, path: str = "/runs") -> str:
    """A link to ``path`` on the server at ``base_url`` that opens without the token for ``valid_s`` seconds."""
    signer = LinkSigner(config.operator_token)
    return base_url.rstrip("/") + signer.sign(path, expires_at=int(time.time()) + valid_s)


class RunsPage:
    """The two routes over ``config`` (its operator token, Temporal UI URL, prices) and ``with_client``, which
    runs a coroutine with the server's Temporal client."""

    def __init__(self, config: DurafixConfig, with_client: WithClient) -> None:
        self.config = config
        self.with_client = with_client
        self.signer = LinkSigner(config.operator_token) if len(config.operator_token.encode()) >= 16 else None

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/runs", self.runs, methods=["GET"]),
            Route("/runs/{run:path}", self.run, methods=["GET"]),
        ]

    # ---- access ---------------------------------------------------------------------------------------

    def refusal(self, request: Request) -> str:
        """``""`` when the request may see the page, else why not."""
        if self.signer is None:
            return "no operator token is configured (DURAFIX_OPERATOR_TOKEN, at least 16 characters)"
        given = request.headers.get("authorization", "")
        if given.startswith("Bearer "):
            token = given.removeprefix("Bearer ").strip().encode("utf-8", "replace")
            return "" if hmac.compare_digest(token, self.config.operator_token.encode()) else "bad token"
        # The path as sent (a run's ID is percent-encoded in it), which is what its link signed.
        raw = request.scope.get("raw_path") or request.url.path.encode()
        return self.signer.check(raw.decode("ascii", "replace"), request.query_params, time.time())

    def _sign(self, path: str) -> str:
        assert self.signer is not None
        return self.signer.sign(path, expires_at=int(time.time()) + LINK_TTL_S)

    def _denied(self, why: str) -> Response:
        body = f"<h1>401</h1><p>{escape(why)}: the runs page needs the operator token or a signed link.</p>"
        return _page("durafix runs: not allowed", body, 401, {"WWW-Authenticate": 'Bearer realm="durafix runs"'})

    async def _read(self, fn: Callable[[Client], Awaitable[T]]) -> T | Response:
        try:
            return await self.with_client(fn)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return _page("durafix runs: not found", "<h1>404</h1><p>no such run</p>", 404)
            return _page("durafix runs: unavailable", f"<h1>503</h1><p>{escape(err.message)}</p>", 503)
        except (RuntimeError, TimeoutError) as err:
            return _page("durafix runs: unavailable", f"<h1>503</h1><p>{escape(str(err))}</p>", 503)

    # ---- GET /runs ------------------------------------------------------------------------------------

    async def runs(self, request: Request) -> Response:
        why = self.refusal(request)
        if why:
            return self._denied(why)
        found = await self._read(lambda client: list_runs(client, self.config))
        if isinstance(found, Response):
            return found
        repository = request.query_params.get("repository", "")
        outcome = request.query_params.get("outcome", "")
        shown = [r for r in found if _matches(r, repository, outcome)]
        body = "<h1>durafix runs</h1>" + self._filter_form(found, repository, outcome)
        body += f"<p>{len(shown)} of {len(found)} runs</p>"
        body += _table(
            (
                "run",
                "repository",
                "issue",
                "phase",
                "now",
                "age",
                "outcome",
                "attempts",
                "tokens",
                "cost",
                "links",
            ),
            (self._list_row(r) for r in shown),
        )
        return _page("durafix runs", body)

    def _filter_form(self, rows: Sequence[RunRow], repository: str, outcome: str) -> str:
        repositories = sorted({r.repository for r in rows})
        outcomes = sorted({r.outcome or RUNNING for r in rows})
        hidden = ""
        signed = self._sign("/runs")
        query = signed.partition("?")[2]
        for key, value in (pair.split("=", 1) for pair in query.split("&") if "=" in pair):
            if key in (SIG, EXP):
                hidden += f'<input type="hidden" name="{escape(key)}" value="{escape(value)}">'
        return (
            '<form method="get" action="/runs">'
            + _select("repository", "repository", repositories, repository)
            + _select("outcome", "outcome", outcomes, outcome)
            + hidden
            + '<button type="submit">filter</button></form>'
        )

    def _list_row(self, row: RunRow) -> list[str]:
        page = self._sign(f"/runs/{quote(row.workflow_id, safe='')}")
        outcome_class = "merged" if row.outcome == "merged" else ("failed" if row.outcome else "")
        return [
            f'<a href="{escape(page)}">{escape(row.workflow_id)}</a>',
            escape(row.repository),
            escape(str(row.issue) if row.issue is not None else "-"),
            escape(row.phase),
            escape(row.sub_state or "-"),
            escape(age(row.started)),
            f'<span class="{outcome_class}">{escape(row.outcome or RUNNING)}</span>'
            + (f"<br>{escape(row.detail)}" if row.detail else ""),
            str(row.attempts),
            escape(str(row.tokens) if row.tokens is not None else "-"),
            escape(row.cost or "-"),
            " ".join(_links(row)),
        ]

    # ---- GET /runs/<run> ------------------------------------------------------------------------------

    async def run(self, request: Request) -> Response:
        why = self.refusal(request)
        if why:
            return self._denied(why)
        workflow_id = request.path_params["run"]
        found = await self._read(lambda client: run_detail(client, self.config, workflow_id))
        if isinstance(found, Response):
            return found
        return _page(f"durafix run {workflow_id}", self._detail(found))

    def _detail(self, d: RunDetail) -> str:
        row = d.row
        back = self._sign("/runs")
        body = f'<nav><a href="{escape(back)}">all runs</a>{" ".join(_links(row))}</nav>'
        body += f"<h1>{escape(row.workflow_id)}</h1>"
        facts = [
            ("repository", row.repository),
            ("issue", str(row.issue) if row.issue is not None else "-"),
            ("status", row.status),
            ("phase", row.phase),
            ("now", row.sub_state or "-"),
            ("outcome", (row.outcome or RUNNING) + (f": {row.detail}" if row.detail else "")),
            ("started", _when(row.started)),
            ("closed", _when(row.closed) if row.closed else "-"),
            ("attempts", str(row.attempts)),
            ("tokens", str(row.tokens) if row.tokens is not None else "-"),
            ("cost", row.cost or "-"),
            ("cleanup", d.cleanup or "-"),
        ]
        if d.not_live:
            facts.append(("not live", d.not_live))
        body += "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in facts) + "</table>"
        body += "<h2>phases</h2>" + _table(("phase", "entered"), ([escape(p), escape(_when(at))] for p, at in d.phases))
        body += "<h2>steps</h2>" + _table(
            ("time", "event", "detail"),
            ([escape(s["time"]), _event_cell(s["event"]), escape(str(s["detail"]))] for s in d.steps),
        )
        body += "<h2>heads and verdicts</h2>" + _table(
            ("commit", "verdict", "detail"), ([escape(c), escape(v), escape(x)] for c, v, x in d.heads)
        )
        body += "<h2>owned resources on this host</h2>" + _table(
            ("provider", "kind", "resource", "run", "operation", "status"),
            ([escape(cell) for cell in r] for r in d.resources),
        )
        return body


def _matches(row: RunRow, repository: str, outcome: str) -> bool:
    if repository and row.repository != repository:
        return False
    return not outcome or (row.outcome or RUNNING) == outcome


def _links(row: RunRow) -> list[str]:
    named = [
        ("ticket", row.ticket_url),
        ("PR", row.pr_url),
        ("evidence", row.report_url),
        ("Temporal", row.temporal_url),
    ]
    return [f'<a href="{escape(url)}">{escape(name)}</a>' for name, url in named if url and _web(url)]


def _web(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def _event_cell(event: str) -> str:
    failed = event.endswith(("_failed", "_timed_out"))
    return f'<span class="failed">{escape(event)}</span>' if failed else escape(event)


def _when(at: datetime) -> str:
    return at.isoformat(timespec="seconds")


def _select(name: str, label: str, options: Iterable[str], chosen: str) -> str:
    items = f'<option value="">any {escape(label)}</option>'
    for option in options:
        selected = " selected" if option == chosen else ""
        items += f'<option value="{escape(option)}"{selected}>{escape(option)}</option>'
    return f'<label>{escape(label)} <select name="{escape(name)}">{items}</select></label> '


def _table(head: Sequence[str], rows: Iterable[list[str]]) -> str:
    """A table of cells already escaped (or made of escaped parts); ``none`` when there are no rows."""
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return "<p>none</p>"
    return "<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>" + body + "</table>"


def _page(title: str, body: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    html = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )
    return HTMLResponse(html, status, headers={**HEADERS, **(headers or {})})
