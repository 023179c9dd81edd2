"""A ``durafix worker`` running a changed release of the workflow:
:class:`tests.replay.changed_workflow.ChangedRepairBug` in place of the current ``repair_bug`` (same name, same
queues, every activity as in the product).

Test-only: started like ``python -m pipeline`` (``python tests/recovery/changed_code_worker.py --state-dir S
worker``), it swaps the class the worker registers and hands over to the product's CLI.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from pipeline.cli import main
    from pipeline.worker import runner as worker
    from tests.replay.changed_workflow import ChangedRepairBug

    worker.RepairBugWorkflow = ChangedRepairBug  # type: ignore[attr-defined]
    main()
