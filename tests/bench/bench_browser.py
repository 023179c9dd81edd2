"""Benchmark: one reproduction of the cart bug with a cold browser vs the kept browser.

Run: ``uv run python -m tests.bench.bench_browser [--runs 10]``. "Cold" builds a new BrowserRunner for
each reproduction (driver start + Chromium launch + the procedure + shutdown), as a worker that launched a
browser per activity would; "kept" reuses one runner whose browser is already up, as a worker does; "kept
with video" is the kept browser also recording a WebM of the run (system ffmpeg), the cost of turning video
on. Prints the median wall time of each and their ratios to "kept".
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from browser.procedure import Procedure, parse_procedure
from browser.results import ReproductionStatus
from browser.runner import BrowserRunner
from tests.bench.report import argument_parser
from tests.support.browser_apps import CART_DIR, serve_cart


def reproduce(runner: BrowserRunner, procedure: Procedure, url: str, out_dir: Path) -> None:
    result = runner.run(procedure, url, out_dir)
    if result.status != ReproductionStatus.REPRODUCED:
        raise SystemExit(f"benchmark reproduction was {result.status}: {result.detail}")


def time_cold(procedure: Procedure, url: str, out_dir: Path) -> float:
    started = time.perf_counter()
    with BrowserRunner() as runner:
        reproduce(runner, procedure, url, out_dir)
    return time.perf_counter() - started


def time_kept(runner: BrowserRunner, procedure: Procedure, url: str, out_dir: Path) -> float:
    started = time.perf_counter()
    reproduce(runner, procedure, url, out_dir)
    return time.perf_counter() - started


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    # One pass per reproduction, so the figure is the cost of a single run of the procedure.
    procedure = parse_procedure((CART_DIR / "repro.yaml").read_text()).model_copy(update={"runs": 1})
    with tempfile.TemporaryDirectory(prefix="bench-browser-") as tmp, serve_cart() as url:
        out = Path(tmp)
        cold = [time_cold(procedure, url, out / f"cold-{i}") for i in range(args.runs)]
        with BrowserRunner() as runner:
            reproduce(runner, procedure, url, out / "warm-up")
            kept = [time_kept(runner, procedure, url, out / f"kept-{i}") for i in range(args.runs)]
        with BrowserRunner(video_dir=out / "browsers") as recording:
            reproduce(recording, procedure, url, out / "video-warm-up")
            video = [time_kept(recording, procedure, url, out / f"video-{i}") for i in range(args.runs)]
    cold_median, kept_median, video_median = (statistics.median(t) for t in (cold, kept, video))
    print(f"reproduction, cold browser:            median {cold_median * 1000:8.1f} ms over {args.runs} runs")
    print(f"reproduction, kept browser:            median {kept_median * 1000:8.1f} ms over {args.runs} runs")
    print(f"reproduction, kept browser with video: median {video_median * 1000:8.1f} ms over {args.runs} runs")
    print(f"cold / kept: {cold_median / kept_median:.2f}x; with video / kept: {video_median / kept_median:.2f}x")


if __name__ == "__main__":
    main()
