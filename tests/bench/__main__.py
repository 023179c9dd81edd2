"""``make bench``: every benchmark, one after another, each printing medians and ratios.

``python -m tests.bench [NAME ...]`` runs a subset (names: workspace, depcache, depcache_pnpm, browser, evidence,
docker, agent, parked, failover, forge_writes, tax, throughput, webhook_pr, critical_path, hosts).
"""

from __future__ import annotations

import importlib
import sys
import time

BENCHMARKS = ["workspace", "depcache", "depcache_pnpm", "browser", "evidence", "docker", "agent", "parked"]
BENCHMARKS += ["failover", "forge_writes"]  # recovery: resume after a kill, writes per effectively-once object
BENCHMARKS += ["tax", "throughput", "webhook_pr"]  # orchestration: the durability tax, throughput, webhook to PR
BENCHMARKS += ["critical_path"]  # label -> draft PR -> awaiting review per project, against its floor
BENCHMARKS += ["hosts"]  # scale-out: runs/min on 1 worker host vs 3 (network namespaces, root)


def main(argv: list[str]) -> int:
    names = argv or BENCHMARKS
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmarks {unknown}; choose from {BENCHMARKS}", file=sys.stderr)
        return 2
    for name in names:
        print(f"\n== {name} ==", flush=True)
        started = time.monotonic()
        module = f"tests.bench.bench_{name}"
        sys.argv = [module]  # each benchmark parses its own options; run it with its defaults
        importlib.import_module(module).main()
        print(f"({name}: {time.monotonic() - started:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
