"""GitHub's page-number pagination: ``per_page`` (default 30, max 100), ``page`` and a ``Link`` header."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .router import Ctx
from .wire import Response, invalid_field

T = TypeVar("T")


def page_params(ctx: Ctx) -> tuple[int, int]:
    try:
        per_page = int(ctx.request.arg("per_page") or 30)
        page = int(ctx.request.arg("page") or 1)
    except ValueError as exc:
        raise invalid_field("Pagination", "per_page") from exc
    return min(max(per_page, 1), 100), max(page, 1)


def paginate(ctx: Ctx, items: Sequence[T], render: Callable[[T], Any]) -> Response:
    """Render one page of ``items`` and link to its neighbours like GitHub does."""
    per_page, page = page_params(ctx)
    last = max((len(items) + per_page - 1) // per_page, 1)
    chunk = items[(page - 1) * per_page : page * per_page]
    links = []

    def url(n: int) -> str:
        query = {k: v[-1] for k, v in ctx.request.query.items()}
        query.update({"per_page": str(per_page), "page": str(n)})
        return f"{ctx.base_url}{ctx.request.path}?{urllib.parse.urlencode(query)}"

    if page > 1:
        links.append(f'<{url(page - 1)}>; rel="prev"')
    if page < last:
        links.append(f'<{url(page + 1)}>; rel="next"')
        links.append(f'<{url(last)}>; rel="last"')
    if page > 1:
        links.append(f'<{url(1)}>; rel="first"')
    headers = [("Link", ", ".join(links))] if links else []
    return Response.json(200, [render(item) for item in chunk], headers)
