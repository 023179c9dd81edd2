"""The filter and order arguments GitHub's issue and pull request lists share.

``state`` is ``open`` (the default), ``closed`` or ``all``; any other value is a 422. ``sort`` picks one of the
list's sort keys, an unknown or missing one sorting by creation; ``direction=asc`` sorts ascending, anything
else descending. Ties are broken by ID in the same direction, so a page boundary never splits an order.
"""

from __future__ import annotations

from collections.abc import Mapping

from .wire import Request, invalid_field


def state_filter(req: Request, resource: str) -> str | None:
    """The state the list is limited to, or None for ``all``."""
    state = req.arg("state") or "open"
    if state not in ("open", "closed", "all"):
        raise invalid_field(resource, "state")
    return None if state == "all" else state


def order_by(req: Request, sort_columns: Mapping[str, str], id_column: str) -> str:
    """The ``ORDER BY`` terms for the request; ``sort_columns`` maps sort keys (``created`` among them) to columns."""
    column = sort_columns.get(req.arg("sort") or "created", sort_columns["created"])
    direction = "ASC" if req.arg("direction") == "asc" else "DESC"
    return f"{column} {direction}, {id_column} {direction}"
