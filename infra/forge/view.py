"""A read/write view of the forge inside one transaction: the database, the git repos and the URLs.

Every ``url``/``html_url`` the forge hands out is built here from the server's own base URL, because clients
(PyGithub among them) check that response URLs start with the base URL they were given.
"""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .gitrepo import GitRepo, Identity
from .names import now_iso
from .wire import not_found


def node_id(kind: str, object_id: int) -> str:
    prefix = "".join(c for c in kind if c.isupper()) or kind[:2].upper()
    return f"{prefix}_" + base64.urlsafe_b64encode(f"{kind}:{object_id}".encode()).decode().rstrip("=")


def ids(kind: str, object_id: int) -> dict[str, Any]:
    """The ``id`` and ``node_id`` every REST object of ``kind`` opens with (GraphQL's ID is derived from both)."""
    return {"id": object_id, "node_id": node_id(kind, object_id)}


def parse_node_id(value: str) -> tuple[str, int] | None:
    _, _, encoded = value.partition("_")
    try:
        kind, _, raw_id = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode().partition(":")
        return kind, int(raw_id)
    except (ValueError, UnicodeDecodeError):
        return None


@dataclass
class View:
    db: sqlite3.Connection
    base_url: str
    repos_root: Path
    viewer: sqlite3.Row | None
    _users: dict[int, sqlite3.Row] = field(default_factory=dict)

    @property
    def api(self) -> str:
        return self.base_url + "/api/v3"

    def user_row(self, user_id: int) -> sqlite3.Row:
        row = self._users.get(user_id)
        if row is None:
            row = self.db.execute("SELECT * FROM users WHERE id = ?", (user_id,)).fetchone()
            self._users[user_id] = row
        return row

    def user_by_login(self, login: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.db.execute("SELECT * FROM users WHERE login = ?", (login,)).fetchone()
        return row

    def repo_row(self, repo_id: int) -> sqlite3.Row:
        row: sqlite3.Row = self.db.execute("SELECT * FROM repos WHERE id = ?", (repo_id,)).fetchone()
        return row

    def existing(self, sql: str, args: Sequence[object]) -> sqlite3.Row:
        """The first row ``sql`` selects; when there is none the resource is unknown (404), as GitHub answers."""
        row: sqlite3.Row | None = self.db.execute(sql, args).fetchone()
        if row is None:
            raise not_found()
        return row

    def find_repo(self, owner: str, name: str) -> sqlite3.Row:
        return self.existing(
            "SELECT repos.* FROM repos JOIN users ON users.id = repos.owner_id "
            "WHERE users.login = ? AND repos.name = ?",
            (owner, name),
        )

    def full_name(self, repo: sqlite3.Row) -> str:
        return f"{self.user_row(repo['owner_id'])['login']}/{repo['name']}"

    def repo_path(self, repo: sqlite3.Row) -> Path:
        owner = str(self.user_row(repo["owner_id"])["login"]).lower()
        return self.repos_root / owner / f"{str(repo['name']).lower()}.git"

    def git(self, repo: sqlite3.Row) -> GitRepo:
        return GitRepo(self.repo_path(repo))

    def repo_api(self, repo: sqlite3.Row) -> str:
        return f"{self.api}/repos/{self.full_name(repo)}"

    def repo_html(self, repo: sqlite3.Row) -> str:
        return f"{self.base_url}/{self.full_name(repo)}"

    def identity(self, user: sqlite3.Row) -> Identity:
        """The git author/committer the forge writes for ``user`` (API-made commits, merges)."""
        host = self.base_url.split("://", 1)[-1].split(":")[0]
        email = user["email"] or f"{user['id']}+{user['login']}@users.noreply.{host}"
        return Identity(user["login"], email, now_iso())
