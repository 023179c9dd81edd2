"""Route tables: each ``routes_*`` module fills one, the API front end matches paths against all of them."""

from __future__ import annotations

import re
import sqlite3
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .view import View
from .wire import ApiError, Request, Response, not_found


@dataclass
class Ctx(View):
    """One API request: the view plus the HTTP request and the path parameters of the matched route."""

    req: Request | None = None
    params: dict[str, str] | None = None
    app: Forge | None = None
    is_admin: bool = False

    @property
    def request(self) -> Request:
        assert self.req is not None
        return self.req

    @property
    def forge(self) -> Forge:
        assert self.app is not None
        return self.app

    def p(self, name: str) -> str:
        assert self.params is not None
        return self.params[name]

    def id_param(self, name: str) -> int:
        """The path parameter ``name`` as a numeric ID; anything else names no resource (404)."""
        try:
            return int(self.p(name))
        except ValueError as exc:
            raise not_found() from exc

    def require_viewer(self) -> sqlite3.Row:
        if self.viewer is None:
            raise ApiError(401, "Requires authentication")
        return self.viewer


if TYPE_CHECKING:
    from .app import Forge

Handler = Callable[[Ctx], Response]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    mutates: bool


class RouteTable:
    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, template: str) -> Callable[[Handler], Handler]:
        """Register ``handler`` for ``template``; ``{name}`` is one segment, ``{name:path}`` the rest."""
        regex = re.sub(r"\{(\w+):path\}", r"(?P<\1>.+)", template)
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", regex)
        pattern = re.compile(f"^{regex}$")

        def register(handler: Handler) -> Handler:
            self.routes.append(Route(method, pattern, handler, method not in ("GET", "HEAD")))
            return handler

        return register


def match(tables: list[RouteTable], method: str, path: str) -> tuple[Route, dict[str, str]]:
    """The route for ``method path``; GitHub answers 404 for unknown paths and unsupported methods alike."""
    for table in tables:
        for route in table.routes:
            m = route.pattern.match(path)
            if m is not None and (route.method == method or (method == "HEAD" and route.method == "GET")):
                return route, {k: urllib.parse.unquote(v) for k, v in m.groupdict().items()}
    raise not_found()
