"""The forge's durable state: one SQLite database (WAL) under the data dir.

Contract: every mutation runs inside :meth:`Store.tx`, which holds the store lock, opens an immediate
transaction and commits before the caller answers its client. A ``kill -9`` therefore loses nothing that was
acknowledged; a mutation interrupted before commit leaves no trace. Git objects and refs live in bare
repositories next to the database (see :mod:`infra.forge.gitrepo`); the database never caches a ref, except a
pull request's head SHA, which GitHub also records at sync time.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    login TEXT NOT NULL UNIQUE COLLATE NOCASE,
    email TEXT,
    type TEXT NOT NULL DEFAULT 'User',
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    token TEXT PRIMARY KEY,
    user_id INTEGER NOT NULL REFERENCES users(id),
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS org_members (
    org_id INTEGER NOT NULL REFERENCES users(id),
    user_id INTEGER NOT NULL REFERENCES users(id),
    role TEXT NOT NULL,
    PRIMARY KEY (org_id, user_id)
);
CREATE TABLE IF NOT EXISTS repos (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner_id INTEGER NOT NULL REFERENCES users(id),
    name TEXT NOT NULL COLLATE NOCASE,
    description TEXT,
    private INTEGER NOT NULL,
    default_branch TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    pushed_at TEXT,
    next_number INTEGER NOT NULL DEFAULT 1,
    UNIQUE (owner_id, name)
);
CREATE TABLE IF NOT EXISTS collaborators (
    repo_id INTEGER NOT NULL REFERENCES repos(id),
    user_id INTEGER NOT NULL REFERENCES users(id),
    role TEXT NOT NULL,
    PRIMARY KEY (repo_id, user_id)
);
CREATE TABLE IF NOT EXISTS issues (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    repo_id INTEGER NOT NULL REFERENCES repos(id),
    number INTEGER NOT NULL,
    title TEXT NOT NULL,
    body TEXT,
    state TEXT NOT NULL,
    state_reason TEXT,
    user_id INTEGER NOT NULL REFERENCES users(id),
    is_pull INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    closed_at TEXT,
    closed_by INTEGER REFERENCES users(id),
    UNIQUE (repo_id, number)
);
CREATE TABLE IF NOT EXISTS issue_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    issue_id INTEGER NOT NULL REFERENCES issues(id),
    actor_id INTEGER NOT NULL REFERENCES users(id),
    event TEXT NOT NULL,
    label_id INTEGER REFERENCES labels(id),
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS labels (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    repo_id INTEGER NOT NULL REFERENCES repos(id),
    name TEXT NOT NULL COLLATE NOCASE,
    color TEXT NOT NULL,
    description TEXT,
    UNIQUE (repo_id, name)
);
CREATE TABLE IF NOT EXISTS issue_labels (
    issue_id INTEGER NOT NULL REFERENCES issues(id),
    label_id INTEGER NOT NULL REFERENCES labels(id),
    PRIMARY KEY (issue_id, label_id)
);
CREATE TABLE IF NOT EXISTS comments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    issue_id INTEGER NOT NULL REFERENCES issues(id),
    user_id INTEGER NOT NULL REFERENCES users(id),
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pulls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    issue_id INTEGER NOT NULL UNIQUE REFERENCES issues(id),
    head_ref TEXT NOT NULL,
    head_sha TEXT NOT NULL,
    base_ref TEXT NOT NULL,
    base_sha TEXT NOT NULL,
    draft INTEGER NOT NULL,
    merged_at TEXT,
    merged_by INTEGER REFERENCES users(id),
    merge_commit_sha TEXT,
    maintainer_can_modify INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS review_requests (
    pull_id INTEGER NOT NULL REFERENCES pulls(id),
    user_id INTEGER NOT NULL REFERENCES users(id),
    PRIMARY KEY (pull_id, user_id)
);
CREATE TABLE IF NOT EXISTS reviews (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pull_id INTEGER NOT NULL REFERENCES pulls(id),
    user_id INTEGER NOT NULL REFERENCES users(id),
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    submitted_at TEXT
);
CREATE TABLE IF NOT EXISTS review_comments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    review_id INTEGER NOT NULL REFERENCES reviews(id),
    pull_id INTEGER NOT NULL REFERENCES pulls(id),
    user_id INTEGER NOT NULL REFERENCES users(id),
    path TEXT NOT NULL,
    line INTEGER,
    side TEXT NOT NULL,
    body TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS statuses (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    repo_id INTEGER NOT NULL REFERENCES repos(id),
    sha TEXT NOT NULL,
    state TEXT NOT NULL,
    target_url TEXT,
    description TEXT,
    context TEXT NOT NULL,
    creator_id INTEGER NOT NULL REFERENCES users(id),
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS hooks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    repo_id INTEGER NOT NULL REFERENCES repos(id),
    url TEXT NOT NULL,
    content_type TEXT NOT NULL,
    secret TEXT,
    insecure_ssl TEXT NOT NULL,
    events TEXT NOT NULL,
    active INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    last_code INTEGER,
    last_status TEXT,
    last_message TEXT
);
CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hook_id INTEGER NOT NULL REFERENCES hooks(id),
    repo_id INTEGER NOT NULL REFERENCES repos(id),
    guid TEXT NOT NULL,
    event TEXT NOT NULL,
    action TEXT,
    redelivery INTEGER NOT NULL,
    request_headers TEXT NOT NULL,
    request_body TEXT NOT NULL,
    state TEXT NOT NULL,
    status TEXT,
    status_code INTEGER,
    response_headers TEXT,
    response_body TEXT,
    duration REAL,
    delivered_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_pending ON deliveries(state, id);
CREATE TABLE IF NOT EXISTS teams (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    org_id INTEGER NOT NULL REFERENCES users(id),
    name TEXT NOT NULL,
    slug TEXT NOT NULL COLLATE NOCASE,
    description TEXT,
    privacy TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (org_id, slug)
);
CREATE TABLE IF NOT EXISTS apps (
    id INTEGER PRIMARY KEY,
    slug TEXT NOT NULL UNIQUE COLLATE NOCASE,
    name TEXT NOT NULL,
    public_key TEXT NOT NULL,
    owner_id INTEGER REFERENCES users(id),
    bot_user_id INTEGER NOT NULL REFERENCES users(id),
    token_lifetime_s INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS installations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    app_id INTEGER NOT NULL REFERENCES apps(id),
    account_id INTEGER NOT NULL REFERENCES users(id),
    repository_selection TEXT NOT NULL,
    permissions TEXT NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (app_id, account_id)
);
CREATE TABLE IF NOT EXISTS installation_repos (
    installation_id INTEGER NOT NULL REFERENCES installations(id),
    repo_id INTEGER NOT NULL REFERENCES repos(id),
    PRIMARY KEY (installation_id, repo_id)
);
CREATE TABLE IF NOT EXISTS installation_tokens (
    token TEXT PRIMARY KEY,
    installation_id INTEGER NOT NULL REFERENCES installations(id),
    created_at TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS team_members (
    team_id INTEGER NOT NULL REFERENCES teams(id),
    user_id INTEGER NOT NULL REFERENCES users(id),
    role TEXT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (team_id, user_id)
);
"""

# Columns added after the first release of the schema, with their definitions: a data dir made before they
# existed gets them on open (``CREATE TABLE IF NOT EXISTS`` leaves an existing table as it is).
ADDED_COLUMNS = {
    "repos": {
        "allow_merge_commit": "INTEGER NOT NULL DEFAULT 1",
        "allow_squash_merge": "INTEGER NOT NULL DEFAULT 1",
        "allow_rebase_merge": "INTEGER NOT NULL DEFAULT 0",
    },
    # The (base tip, head) pair whose mergeability was last computed, and the result: GitHub computes it in
    # the background after a change, so a pull request read before that answers ``mergeable: null``.
    "pulls": {"mergeable_for": "TEXT", "mergeable": "INTEGER"},
}


class Store:
    """A single SQLite connection shared by all threads, serialised by a re-entrant lock."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL is durable against process death in WAL mode; only an OS crash could lose the last commit.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.executescript(SCHEMA)
        for table, columns in ADDED_COLUMNS.items():
            present = {row["name"] for row in self._conn.execute(f"PRAGMA table_info({table})")}
            for name, definition in columns.items():
                if name not in present:
                    self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
        self._depth = 0

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """Run the block in one immediate transaction; nested calls join the outer one."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._conn
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            else:
                self._conn.execute("COMMIT")
            finally:
                self._depth = 0

    def close(self) -> None:
        with self._lock:
            self._conn.close()
