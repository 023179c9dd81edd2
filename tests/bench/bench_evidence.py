"""Benchmark: artifact upload throughput, local store vs S3 on SeaweedFS.

Run: ``uv run python -m tests.bench.bench_evidence [--mib 32] [--runs 10]``. Each run puts a file of
fresh content (so no put takes the idempotent fast path) and the median of the runs is printed for each
store in MiB/s, with their ratio. The S3 side streams: one hash pass, then a conditional multipart upload
(8 MiB parts) to a SeaweedFS ``weed mini`` on loopback.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from evidence.interface import ArtifactKind, ArtifactStore
from evidence.local import LocalArtifactStore
from evidence.s3 import S3ArtifactStore, S3Credentials
from infra.s3 import SeaweedS3

MIB = 1024 * 1024


def write_fresh(path: Path, mib: int, seed: int) -> None:
    block = os.urandom(MIB)
    with path.open("wb") as out:
        out.write(seed.to_bytes(8, "big"))
        for _ in range(mib):
            out.write(block)


def time_puts(store: ArtifactStore, work: Path, mib: int, runs: int, seed0: int) -> list[float]:
    times = []
    for i in range(runs):
        src = work / f"upload-{seed0 + i}.bin"
        write_fresh(src, mib, seed0 + i)
        start = time.perf_counter()
        store.put_file(src, kind=ArtifactKind.TRACE, run_id="bench")
        times.append(time.perf_counter() - start)
        src.unlink()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description="Artifact upload throughput: local store vs S3 (SeaweedFS).")
    parser.add_argument("--mib", type=int, default=32, help="artifact size in MiB")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-evidence-") as tmp:
        root = Path(tmp)
        local = LocalArtifactStore(root / "local")
        with SeaweedS3(root / "seaweedfs") as server:
            server.create_bucket("bench")
            s3 = S3ArtifactStore(
                "bench",
                endpoint_url=server.endpoint_url,
                credentials=S3Credentials(access_key_id=server.access_key, secret_access_key=server.secret_key),
            )
            local_times = time_puts(local, root, args.mib, args.runs, seed0=0)
            s3_times = time_puts(s3, root, args.mib, args.runs, seed0=args.runs)
    local_s, s3_s = statistics.median(local_times), statistics.median(s3_times)
    size = args.mib + 8 / MIB
    print(f"evidence upload benchmark: {args.mib} MiB artifacts, median of {args.runs} runs each")
    for label, median, times in (("local store", local_s, local_times), ("S3 on SeaweedFS", s3_s, s3_times)):
        runs = ", ".join(f"{t:.3f}" for t in times)
        print(f"  {label + ':':17} {median:.3f} s  {size / median:8.1f} MiB/s  ({runs})")
    print(f"  ratio (S3 time / local time): {s3_s / local_s:.2f}x")


if __name__ == "__main__":
    main()
