"""Benchmark: the cart container's provision-to-ready time with a cold image build vs a cached image.

Run: ``uv run python -m tests.bench.bench_docker [--runs 5] [--cold-runs 3]`` (as root, with dockerd and
debootstrap installed, the Debian mirror reachable). Starts a private engine in a temporary directory and
stops it at the end. Three cases, each the wall time of one ``provision`` until the readiness probe passes:

- cold: empty image cache and no images in the engine (debootstrap + import + app build + start);
- cached rootfs: the root filesystem tarball is cached, the engine has no images (import + app build + start);
- cached image: the app image is present (create + start only).

Prints the median, min and max of each and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import yaml

from environments.docker import DockerProvider
from environments.interface import AppRecipe, RecoverySpec
from infra.docker.engine import DockerEngine

CART = Path(__file__).resolve().parents[2] / "examples" / "cart"


def provision_seconds(provider: DockerProvider, spec: RecoverySpec, workspace: Path) -> float:
    run_id = f"bench-{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    provider.provision(run_id=run_id, op_id=f"{run_id}:env", spec=spec, workspace=str(workspace))
    elapsed = time.perf_counter() - started
    report = provider.cleanup_run(run_id)
    if not report.complete:
        raise SystemExit(f"cleanup of {run_id} left {report.remaining}: {report.errors}")
    return elapsed


def drop_images(provider: DockerProvider) -> None:
    # Newest first: an app image is built on its base, and the engine refuses to remove a parent first.
    images = provider.client.images.list(filters={"label": "durafix.image"})
    for image in sorted(images, key=lambda i: str(i.attrs["Created"]), reverse=True):
        provider.client.images.remove(image.id, force=True)


def measure(
    name: str, runs: int, provider: DockerProvider, spec: RecoverySpec, workspace: Path, *, drop_cache: bool
) -> list[float]:
    samples = []
    for _ in range(runs):
        drop_images(provider)
        if drop_cache:
            shutil.rmtree(provider.images.cache_dir, ignore_errors=True)
        samples.append(provision_seconds(provider, spec, workspace))
        print(f"  {name}: {samples[-1]:.2f}s", flush=True)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5, help="runs of the cached cases")
    parser.add_argument("--cold-runs", type=int, default=3, help="runs of the cold case (each bootstraps Debian)")
    args = parser.parse_args()
    recipe = AppRecipe.model_validate(yaml.safe_load((CART / "durafix.yaml").read_text()))
    spec = RecoverySpec(
        repository="example/cart",
        clone_url="https://forge.invalid/example/cart.git",
        base_revision="0" * 40,
        recipe=recipe,
    )
    # A short root: containerd refuses socket paths over 104 bytes.
    with tempfile.TemporaryDirectory(prefix="dfx-bench-", dir="/tmp") as tmp:
        root = Path(tmp)
        workspace = root / "cart"
        shutil.copytree(CART, workspace, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        engine = DockerEngine(root / "engine")
        provider = DockerProvider(root / "provider", engine.ensure_running())
        try:
            cold = measure("cold", args.cold_runs, provider, spec, workspace, drop_cache=True)
            rootfs = measure("cached rootfs", args.runs, provider, spec, workspace, drop_cache=False)
            cached = [provision_seconds(provider, spec, workspace) for _ in range(args.runs)]
        finally:
            provider.close()
            engine.stop()
    print(f"{'case':<15}{'runs':>6}{'median s':>11}{'min s':>9}{'max s':>9}")
    for name, samples in (("cold", cold), ("cached rootfs", rootfs), ("cached image", cached)):
        print(f"{name:<15}{len(samples):>6}{statistics.median(samples):>11.2f}{min(samples):>9.2f}{max(samples):>9.2f}")
    base = statistics.median(cached)
    print(f"cold / cached image: {statistics.median(cold) / base:.1f}x")
    print(f"cached rootfs / cached image: {statistics.median(rootfs) / base:.1f}x")


if __name__ == "__main__":
    main()
