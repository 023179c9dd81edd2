"""The forge application behind the HTTP server: state, routing, faults and the API request cycle.

One API request is: consume a matching fault (which may answer instead, before anything is applied),
authenticate, run the route inside one store transaction, commit, wake the webhook sender, then answer, or,
for a ``drop_after_apply`` fault, close the connection without answering although the change is committed.

Conditional requests, as on GitHub: every successful GET carries an ``ETag`` (weak, a hash of the body and
the ``Link`` header); a GET whose ``If-None-Match`` names it is answered 304 without a body, and a 304 does not
count against the rate limit.
"""

from __future__ import annotations

import hashlib
import sqlite3
import sys
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import (
    routes_admin,
    routes_apps,
    routes_git,
    routes_graphql,
    routes_hooks,
    routes_issues,
    routes_pulls,
    routes_repos,
    routes_reviews,
    routes_teams,
    routes_users,
)
from .apps import verify_jwt
from .auth import authenticate, bearer_token, looks_like_jwt
from .faults import FaultRegistry, error_before_apply
from .ratelimit import RateCounter
from .router import Ctx, match
from .store import Store
from .view import View
from .webhooks import Deliverer
from .wire import ApiError, Request, Response, not_found

API_PREFIX = "/api/v3"
GRAPHQL_PATH = "/api/graphql"
FAULTS_PATH = API_PREFIX + "/admin/faults"
TABLES = [
    routes_admin.routes,
    routes_apps.routes,
    routes_users.routes,
    routes_repos.routes,
    routes_git.routes,
    routes_issues.routes,
    routes_pulls.routes,
    routes_reviews.routes,
    routes_hooks.routes,
    routes_graphql.routes,
    routes_teams.routes,
]


@dataclass(frozen=True)
class Dropped:
    """The request was applied and committed; the connection must be closed without an answer."""


class Forge:
    """State (store, repositories, faults, rate counters, webhook sender) and the API request cycle."""

    def __init__(self, data_dir: Path, admin_token: str) -> None:
        if not admin_token:
            raise ValueError("the forge needs an admin token")
        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self.repos_root = data_dir / "repos"
        self.repos_root.mkdir(exist_ok=True)
        self.admin_token = admin_token
        self.base_url = ""
        self.store = Store(data_dir / "forge.sqlite3")
        self.faults = FaultRegistry()
        # Whether ``GET .../issues/{number}/events`` answers (GitHub's does); off by default, as the emulator's
        # first releases kept no events and tests of the fallback (the issue's author as its labeller) need that.
        self.issue_events = False
        self.rates = RateCounter()
        self.deliverer = Deliverer(self.store)

    def start(self, base_url: str) -> None:
        self.base_url = base_url
        self.deliverer.start()

    def stop(self) -> None:
        self.deliverer.stop()
        self.store.close()

    def view(self, db: sqlite3.Connection, viewer: sqlite3.Row | None) -> View:
        return View(db, self.base_url, self.repos_root, viewer)

    def handle_api(self, req: Request) -> Response | Dropped:
        request_id = uuid.uuid4().hex[:20].upper()
        fault = None if req.path.startswith(FAULTS_PATH) else self.faults.take(req.method, req.path)
        viewer = None
        try:
            is_admin = bearer_token(req.headers) == self.admin_token
            with self.store.tx() as db:
                viewer = None if is_admin else authenticate(db, req.headers)
            early = error_before_apply(fault, request_id, viewer["id"] if viewer else None) if fault else None
            response = _error(early) if early is not None else self._route(req, viewer, is_admin)
        except ApiError as err:
            response = _error(err)
        except Exception:
            # A bug must not look like a dropped connection (that is a fault's job): answer 500, keep the trace.
            traceback.print_exc(file=sys.stderr)
            response = _error(ApiError(500, "Server Error"))
        if fault is not None and fault.action == "drop_after_apply":
            return Dropped()
        response, charge = _conditional(req, response)
        caller = f"user:{viewer['id']}" if viewer is not None else req.client_ip
        resource = "graphql" if req.path == GRAPHQL_PATH else "core"
        headers = self.rates.count(caller, resource, viewer is not None, charge=charge)
        present = {k.lower() for k, _ in response.headers}
        response.headers += [(k, v) for k, v in headers.items() if k not in present]
        response.headers += [
            ("X-GitHub-Media-Type", "github.v3; format=json"),
            ("X-GitHub-Api-Version-Selected", "2022-11-28"),
            ("X-GitHub-Request-Id", request_id),
        ]
        return response

    def _route(self, req: Request, viewer: sqlite3.Row | None, is_admin: bool) -> Response:
        path = req.path if req.path == GRAPHQL_PATH else req.path.removeprefix(API_PREFIX) or "/"
        if path == GRAPHQL_PATH and req.path != GRAPHQL_PATH:
            raise not_found()
        route, params = match(TABLES, req.method, path)
        try:
            with self.store.tx() as db:
                token = bearer_token(req.headers)
                if token and looks_like_jwt(token) and route not in routes_apps.routes.routes:
                    # An App acting as itself reaches only the App endpoints; elsewhere it needs a token.
                    verify_jwt(db, token)
                    raise ApiError(403, "Resource not accessible by integration")
                ctx = Ctx(
                    db, self.base_url, self.repos_root, viewer, req=req, params=params, app=self, is_admin=is_admin
                )
                return route.handler(ctx)
        finally:
            if route.mutates:
                self.deliverer.wake()


# What GitHub sends with cacheable answers: the answer differs per caller and media type.
CACHE_HEADERS = [
    ("Cache-Control", "private, max-age=60, s-maxage=60"),
    ("Vary", "Accept, Authorization, Cookie, X-GitHub-OTP"),
]


def etag_of(response: Response) -> str:
    """A weak entity tag for ``response``: equal bodies (and pagination links) give equal tags."""
    digest = hashlib.sha256(response.body)
    for name, value in response.headers:
        if name.lower() == "link":
            digest.update(b"\0" + value.encode())
    return f'W/"{digest.hexdigest()}"'


def _matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 weak comparison of ``etag`` against an ``If-None-Match`` list (``*`` matches anything)."""
    tags = [tag.strip() for tag in if_none_match.split(",")]
    return "*" in tags or any(tag.removeprefix("W/") == etag.removeprefix("W/") for tag in tags)


def _conditional(req: Request, response: Response) -> tuple[Response, bool]:
    """Tag a successful GET; answer 304 when the client already holds that version. Returns the answer and
    whether it counts against the rate limit (a 304 does not)."""
    if req.method not in ("GET", "HEAD") or response.status != 200:
        return response, True
    etag = etag_of(response)
    condition = req.headers.get("If-None-Match")
    if condition is not None and _matches(condition, etag):
        kept = [(k, v) for k, v in response.headers if k.lower() == "link"]
        return Response(304, b"", [("ETag", etag), *CACHE_HEADERS, *kept]), False
    response.headers += [("ETag", etag), *CACHE_HEADERS]
    return response, True


def _error(err: ApiError) -> Response:
    return Response.json(err.status, err.body(), list(err.headers.items()))
