"""Git over smart HTTP: ``git http-backend`` run as a CGI for ``/OWNER/REPO.git/...``.

Auth is HTTP Basic with a token as the password (any user name). Reads of public repositories need no
credentials; anything else without them is 401 with ``WWW-Authenticate: Basic`` so git asks and retries.
``GIT_PROTOCOL`` is passed through from the ``Git-Protocol`` header, so protocol v2 works.

A push (``git-receive-pack``) is serialised per repository; the refs are read before and after it and the
difference goes through :func:`infra.forge.events.refs_changed` in one transaction: ``push`` webhooks, and
``synchronize`` for open pull requests whose head branch moved.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from typing import TYPE_CHECKING

from . import events
from .auth import bearer_token as token_from
from .auth import repo_role, role_at_least, user_for_token
from .gitrepo import GIT_ENV, GitRepo
from .names import valid_login, valid_repo_name
from .wire import ApiError, Request, Response

if TYPE_CHECKING:
    from .app import Forge

GIT_PATH = re.compile(
    r"^/(?P<owner>[^/]+)/(?P<repo>[^/]+?)(?:\.git)?/(?P<rest>info/refs|git-upload-pack|git-receive-pack|HEAD"
    r"|objects/[0-9a-f]{2}/[0-9a-f]{38}|objects/pack/pack-[0-9a-f]{40}\.(?:pack|idx)|objects/info/[a-z-]+)$"
)
_push_locks: dict[str, threading.Lock] = {}
_push_locks_guard = threading.Lock()


def is_git_path(path: str) -> bool:
    return GIT_PATH.match(path) is not None


def _push_lock(key: str) -> threading.Lock:
    with _push_locks_guard:
        return _push_locks.setdefault(key, threading.Lock())


def _text(status: int, message: str, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, (message + "\n").encode(), [("Content-Type", "text/plain"), *(headers or [])])


def _challenge() -> Response:
    return _text(401, "Authentication required", [("WWW-Authenticate", 'Basic realm="forge"')])


def _run_backend(forge: Forge, req: Request, path_info: str, user: str | None) -> Response:
    env = {
        **os.environ,
        **GIT_ENV,
        "GIT_PROJECT_ROOT": str(forge.repos_root),
        "GIT_HTTP_EXPORT_ALL": "1",
        "PATH_INFO": path_info,
        "REQUEST_METHOD": req.method,
        "QUERY_STRING": "&".join(f"{k}={v}" for k, vs in req.query.items() for v in vs),
        "CONTENT_TYPE": req.headers.get("Content-Type", ""),
        "CONTENT_LENGTH": str(req.body_size),
        "REMOTE_ADDR": req.client_ip,
        "GIT_HTTP_MAX_REQUEST_BUFFER": str(1 << 30),
    }
    if user is not None:
        env["REMOTE_USER"] = user
    protocol = req.headers.get("Git-Protocol")
    if protocol:
        env["GIT_PROTOCOL"] = protocol
    req.body.seek(0)
    proc = subprocess.run(["git", "http-backend"], stdin=req.body, capture_output=True, env=env, check=False)
    head, sep, body = proc.stdout.partition(b"\r\n\r\n")
    if not sep:
        head, sep, body = proc.stdout.partition(b"\n\n")
    status = 200
    headers: list[tuple[str, str]] = []
    for line in head.decode(errors="replace").splitlines():
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.strip().split()[0])
        elif name:
            headers.append((name.strip(), value.strip()))
    if proc.returncode != 0 and not sep:
        return _text(500, "git http-backend failed")
    return Response(status, body, headers)


def handle_git(forge: Forge, req: Request) -> Response:
    m = GIT_PATH.match(req.path)
    assert m is not None
    owner, name, rest = m.group("owner"), m.group("repo"), m.group("rest")
    if not valid_login(owner) or not valid_repo_name(name):
        return _text(404, "Repository not found")
    service = req.query.get("service", [""])[-1] if rest == "info/refs" else rest
    writing = service == "git-receive-pack"
    token = token_from(req.headers)
    with forge.store.tx() as db:
        viewer = user_for_token(db, token) if token else None
        if token is not None and viewer is None:
            return _text(401, "Bad credentials", [("WWW-Authenticate", 'Basic realm="forge"')])
        view = forge.view(db, viewer)
        try:
            repo = view.find_repo(owner, name)
        except ApiError:
            return _challenge() if viewer is None else _text(404, "Repository not found")
        role = repo_role(db, repo, viewer)
        git = GitRepo(view.repo_path(repo))
        path_info = f"/{view.repo_path(repo).relative_to(forge.repos_root).as_posix()}/{rest}"
    if role is None or (writing and not role_at_least(role, "write")):
        if viewer is None:
            return _challenge()
        if role is None:
            return _text(404, "Repository not found")
        return _text(403, f"Permission to {owner}/{name}.git denied to {viewer['login']}.")
    login = viewer["login"] if viewer is not None else None
    if not (writing and req.method == "POST"):
        return _run_backend(forge, req, path_info, login)
    assert viewer is not None
    with _push_lock(path_info):
        before = git.list_refs()
        response = _run_backend(forge, req, path_info, login)
        after = git.list_refs()
        changes = [
            (ref, before.get(ref), after.get(ref))
            for ref in sorted(set(before) | set(after))
            if before.get(ref) != after.get(ref)
        ]
        with forge.store.tx() as db:
            events.refs_changed(forge.view(db, viewer), repo, changes, viewer)
    forge.deliverer.wake()
    return response
