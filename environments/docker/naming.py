"""Names and ownership labels of the Docker resources a run owns.

Names are derived from the IDs alone, so any worker computes the same name for the same operation and a
retried or resumed ``provision`` finds what an earlier attempt created. Docker names allow only
``[a-zA-Z0-9][a-zA-Z0-9_.-]*``: the readable part is sanitised and truncated, and a hash of the full ID keeps
two different IDs from ever sharing a name. The labels, not the names, decide ownership.
"""

from __future__ import annotations

import hashlib
import re

RUN_LABEL = "durafix.run"
OP_LABEL = "durafix.op"
MANAGED_LABEL = "durafix.managed"

_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")


def _name(prefix: str, identity: str, readable_len: int = 40) -> str:
    readable = _UNSAFE.sub("-", identity).strip("-.")[:readable_len] or "id"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return f"{prefix}-{readable}-{digest}"


def container_name(op_id: str) -> str:
    """The container of operation ``op_id``: ``durafix-<sanitised op_id>-<sha256(op_id)[:12]>``."""
    return _name("durafix", op_id)


def network_name(run_id: str) -> str:
    """The network shared by a run's containers: ``durafix-net-<sanitised run_id>-<sha256(run_id)[:12]>``."""
    return _name("durafix-net", run_id)


def ownership_labels(run_id: str, op_id: str) -> dict[str, str]:
    return {RUN_LABEL: run_id, OP_LABEL: op_id, MANAGED_LABEL: "1"}


def owned_by(labels: dict[str, str] | None, run_id: str, op_id: str | None = None) -> bool:
    """True when ``labels`` mark a resource as managed and owned by ``run_id`` (and ``op_id`` when given)."""
    labels = labels or {}
    if labels.get(MANAGED_LABEL) != "1" or labels.get(RUN_LABEL) != run_id:
        return False
    return op_id is None or labels.get(OP_LABEL) == op_id


def run_filter(run_id: str | None) -> dict[str, list[str]]:
    """A Docker API label filter selecting managed resources (of ``run_id`` only, when given)."""
    labels = [f"{MANAGED_LABEL}=1"]
    if run_id is not None:
        labels.append(f"{RUN_LABEL}={run_id}")
    return {"label": labels}
