"""Who may see the runs page (pipeline/cli/runs_page.py): the operator's token, or a link signed with it for
that very path and not expired; nobody while no token is configured."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote, urlsplit

from starlette.requests import Request
from temporalio.client import Client

from pipeline.cli.runs_page import RunsPage, signed_runs_link
from pipeline.config import DurafixConfig

TOKEN = "operator-token-0123456789"
T = TypeVar("T")


def _config(token: str = TOKEN) -> DurafixConfig:
    return DurafixConfig(state_dir=Path("/nonexistent"), operator_token=token)


async def _never(fn: Callable[[Client], Awaitable[T]], /) -> T:
    raise AssertionError("Temporal was asked before access was judged")


def _page(token: str = TOKEN) -> RunsPage:
    return RunsPage(_config(token), _never)


def _request(url: str, authorization: str | None = None) -> Request:
    parts = urlsplit(url)
    headers = [(b"authorization", authorization.encode())] if authorization is not None else []
    scope = {
        "type": "http",
        "method": "GET",
        "path": parts.path,
        "raw_path": parts.path.encode(),
        "query_string": parts.query.encode(),
        "headers": headers,
    }
    return Request(scope)


def test_the_token_as_a_bearer_opens_the_page_and_anything_else_does_not() -> None:
    page = _page()
    assert page.refusal(_request("/runs", f"Bearer {TOKEN}")) == ""
    assert page.refusal(_request("/runs", f"Bearer {TOKEN}x")) == "bad token"
    assert page.refusal(_request("/runs", f"Basic {TOKEN}")) == "no signature"
    assert page.refusal(_request("/runs")) == "no signature"


def test_a_signed_link_opens_its_own_path_until_it_expires() -> None:
    config = _config()
    page = _page()
    run = f"/runs/{quote('repair:o/r#1', safe='')}"
    link = signed_runs_link(config, "http://h", path=run)
    assert page.refusal(_request(link)) == ""
    # Signed for one run, it opens neither another nor the list.
    assert page.refusal(_request(link.replace("%231", "%232"))) == "bad signature"
    assert page.refusal(_request(link.replace(run, "/runs"))) == "bad signature"
    expired = signed_runs_link(config, "http://h", valid_s=-1)
    assert page.refusal(_request(expired)) == "link expired"
    other_key = signed_runs_link(_config("another-token-0123456789"), "http://h")
    assert page.refusal(_request(other_key)) == "bad signature"
    assert int(dict(p.split("=") for p in urlsplit(link).query.split("&"))["exp"]) > time.time()


def test_without_a_token_configured_nobody_sees_the_page() -> None:
    for token in ("", "short"):
        page = _page(token)
        assert "no operator token" in page.refusal(_request("/runs", f"Bearer {token}"))
