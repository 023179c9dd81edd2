"""A realistic evidence bundle for the cart bug, stored in a given store (shared by bundle and report tests)."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Literal

from evidence.bundle import CheckResult, EvidenceBundle, RevisionEvidence
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore

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


def store_cart_bundle(store: ArtifactStore, base_png: bytes, candidate_png: bytes) -> EvidenceBundle:
    procedure = store.put_file(PROCEDURE, kind=ArtifactKind.PROCEDURE, run_id=RUN_ID, revision=BASE)
    spec: list[tuple[Literal["base", "candidate"], str, bytes, str, str]] = [
        ("base", BASE, base_png, "reproduced", "$23.75"),
        ("candidate", CANDIDATE, candidate_png, "not_reproduced", "$40.00"),
    ]
    sides = []
    for role, revision, png, status, total in spec:
        log = json.dumps({"console": [], "total": total}).encode()

        def put(data: bytes, kind: ArtifactKind, name: str, revision: str = revision) -> ArtifactRef:
            return store.put_bytes(data, kind=kind, run_id=RUN_ID, name=name, revision=revision)

        refs = [
            put(_trace_zip(role), ArtifactKind.TRACE, f"{role}-trace.zip"),
            put(png, ArtifactKind.SCREENSHOT, f"{role}-total.png"),
            put(log, ArtifactKind.LOG, f"{role}-log.json"),
        ]
        sides.append(RevisionEvidence.from_refs(role, revision, status, refs, detail=f"#total shows {total}"))
    patch = store.put_bytes(PATCH.encode(), kind=ArtifactKind.PATCH, run_id=RUN_ID, name="fix.diff", revision=CANDIDATE)
    tests = store.put_bytes(
        b"....\n4 passed in 0.03s\n",
        kind=ArtifactKind.TEST_OUTPUT,
        run_id=RUN_ID,
        name="pytest.txt",
        revision=CANDIDATE,
    )
    return EvidenceBundle(
        run_id=RUN_ID,
        repository="acme/shop",
        issue_number=7,
        base_revision=BASE,
        candidate_commit=CANDIDATE,
        procedure=procedure,
        base=sides[0],
        candidate=sides[1],
        patch=patch,
        checks=[CheckResult(name="tests", passed=True, detail="4 passed", output=tests)],
    )
