"""The filter and order arguments GitHub's issue and pull request lists share.

``state`` is ``open`` (the default), ``closed`` or ``all``; any other value is a 422. ``sort`` picks one of the
list's sort keys, an unknown or missing one sorting by creation; ``direction=asc`` sorts ascending, anything
else descending. Ties are broken by ID in the same direction, so a page boundary never splits an order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from .wire import Request, invalid_field


class ListQuery:
    """One list's ``SELECT``: ``sql`` (ending in a ``WHERE`` clause, its parameters ``args``) limited to the requested
    ``state`` of ``state_column`` (422 naming ``resource`` for an unknown one), then narrowed by :meth:`where`.
    Values always travel as parameters, never in the SQL text."""

    def __init__(self, req: Request, resource: str, sql: str, *args: Any, state_column: str) -> None:
        self.req = req
        self.sql = sql
        self.args = list(args)
        state = req.arg("state") or "open"
        if state not in ("open", "closed", "all"):
            raise invalid_field(resource, "state")
        if state != "all":
            self.where(f"{state_column} = ?", state)

    def where(self, condition: str, value: Any) -> None:
        """Keep only the rows for which ``condition`` (one ``?``, bound to ``value``) holds."""
        self.sql += f" AND {condition}"
        self.args.append(value)

    def rows(self, db: sqlite3.Connection, sort_columns: Mapping[str, str], id_column: str) -> list[sqlite3.Row]:
        """The matching rows in the order the request asks for (see :func:`order_by`)."""
        order = order_by(self.req, sort_columns, id_column)
        return db.execute(f"{self.sql} ORDER BY {order}", self.args).fetchall()


def order_by(req: Request, sort_columns: Mapping[str, str], id_column: str) -> str:
    """The ``ORDER BY`` terms for the request; ``sort_columns`` maps sort keys (``created`` among them) to columns."""
    column = sort_columns.get(req.arg("sort") or "created", sort_columns["created"])
    direction = "ASC" if req.arg("direction") == "asc" else "DESC"
    return f"{column} {direction}, {id_column} {direction}"
