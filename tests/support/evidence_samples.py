"""A realistic evidence bundle for the cart bug, stored in a given store (shared by bundle and report tests).

Artifacts are named and shaped as a run stores them: the procedure as the validated model's JSON, the
runner's file names behind a ``reproduce-<revision label>-`` prefix, and each revision's ``log.json`` built by
the runner's own log writer from the outcomes a run of the cart procedure has (base: the total shows
$23.75 and the check holds; candidate: $40.00, it does not).
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Literal

from browser.procedure import parse_procedure
from browser.results import ReproductionStatus
from evidence.bundle import CheckResult, EvidenceBundle, RevisionEvidence
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from tests.support.repair_context import cart_log

RUN_ID = "repair:acme/shop#7"
BASE = hashlib.sha1(b"base revision").hexdigest()
CANDIDATE = hashlib.sha1(b"candidate commit").hexdigest()
PROCEDURE = Path(__file__).resolve().parents[2] / "examples" / "cart" / "repro.yaml"
PATCH = """diff --git a/cart.py b/cart.py
--- a/cart.py
+++ b/cart.py
@@ -19,4 +19,4 @@ def line_total(item: Item) -> int:
 def compute_total(items: list[Item]) -> int:
     \"\"\"Total of the cart in cents.\"\"\"
-    return sum(item.unit_price_cents for item in items)
+    return sum(line_total(item) for item in items)  # </pre><script>alert("patched")</script>
"""


def solid_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid PNG of one colour, for tests that need an image without a browser."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


def _trace_zip(label: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        # A fixed timestamp: the same trace must be the same bytes whenever it is built.
        entry = zipfile.ZipInfo("trace.trace", date_time=(2025, 1, 1, 0, 0, 0))
        zf.writestr(entry, json.dumps({"type": "action", "label": label}) + "\n")
    return buf.getvalue()


def reproduction_log(
    revision_label: str, actuals: list[str], status: ReproductionStatus, holds: bool, detail: str = ""
) -> bytes:
    """The ``log.json`` the runner writes for the cart procedure whose one check saw ``actuals[i]`` in run
    ``i + 1``; screenshots are named as the runner names them."""
    return cart_log(
        actuals,
        holds,
        status=status,
        detail=detail,
        base_url="http://127.0.0.1:8000",
        out_dir=Path(revision_label),
        screenshots=True,
    )


def run_bundle(
    procedure: ArtifactRef,
    base: RevisionEvidence,
    candidate: RevisionEvidence,
    patch: ArtifactRef,
    *,
    repository: str = "acme/shop",
    issue_number: int = 7,
    base_revision: str = BASE,
    candidate_commit: str = CANDIDATE,
    checks: list[CheckResult] | None = None,
) -> EvidenceBundle:
    """The evidence of run ``RUN_ID`` (issue ``issue_number`` of ``repository``) from its parts."""
    return EvidenceBundle(
        run_id=RUN_ID,
        repository=repository,
        issue_number=issue_number,
        base_revision=base_revision,
        candidate_commit=candidate_commit,
        procedure=procedure,
        base=base,
        candidate=candidate,
        patch=patch,
        checks=checks or [],
    )


def store_cart_bundle(
    store: ArtifactStore,
    base_png: bytes,
    candidate_png: bytes,
    base_actual: str = "$23.75",
    candidate_actual: str = "$40.00",
) -> EvidenceBundle:
    """The cart bug's bundle: ``*_png`` is each revision's page after the check (its element crop is a small
    image of one colour per revision), ``*_actual`` the total the check read there in both runs."""
    text = parse_procedure(PROCEDURE.read_text()).model_dump_json(indent=2)
    procedure = store.put_bytes(
        text.encode(),
        kind=ArtifactKind.PROCEDURE,
        run_id=RUN_ID,
        name="procedure.json",
        revision=BASE,
        media_type="application/json",
    )
    spec: list[tuple[Literal["base", "candidate"], str, bytes, ReproductionStatus, str]] = [
        ("base", BASE, base_png, ReproductionStatus.REPRODUCED, base_actual),
        ("candidate", CANDIDATE, candidate_png, ReproductionStatus.NOT_REPRODUCED, candidate_actual),
    ]
    sides = []
    for role, revision, png, status, total in spec:
        label = f"reproduce-{role if role == 'base' else 'candidate-1'}"
        holds = status == ReproductionStatus.REPRODUCED
        # As the runner words it: the value's repr, so any text (a lone surrogate too) is printable.
        detail = f"#total shows {total!r}"
        log = reproduction_log(label, [total, total], status, holds, detail)
        crop = solid_png(3, 1, (255, 200, 0) if role == "base" else (0, 120, 255))

        def put(data: bytes, kind: ArtifactKind, name: str, revision: str = revision, at: str = label) -> ArtifactRef:
            return store.put_bytes(data, kind=kind, run_id=RUN_ID, name=f"{at}-{name}", revision=revision)

        refs = [put(_trace_zip(f"{role} run {run}"), ArtifactKind.TRACE, f"run-{run}-trace.zip") for run in (1, 2)]
        for run in (1, 2):
            # Both runs see the same page: the report shows those pixels once per revision.
            refs.append(put(png, ArtifactKind.SCREENSHOT, f"run-{run}-assert-1.png"))
            refs.append(put(crop, ArtifactKind.SCREENSHOT, f"run-{run}-assert-1-element.png"))
        refs.append(put(log, ArtifactKind.LOG, "log.json"))
        sides.append(RevisionEvidence.from_refs(role, revision, status.value, refs, detail=detail))
    patch = store.put_bytes(PATCH.encode(), kind=ArtifactKind.PATCH, run_id=RUN_ID, name="fix.diff", revision=CANDIDATE)
    tests = store.put_bytes(
        b"....\n4 passed in 0.03s\n",
        kind=ArtifactKind.TEST_OUTPUT,
        run_id=RUN_ID,
        name="pytest.txt",
        revision=CANDIDATE,
    )
    checks = [CheckResult(name="tests", passed=True, detail="4 passed", output=tests)]
    return run_bundle(procedure, sides[0], sides[1], patch, checks=checks)
