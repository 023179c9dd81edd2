"""``python -m infra.modelserver serve`` runs as a real process: prints its URL, serves, stops on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.served import started_printing_url

REPO = Path(__file__).resolve().parents[3]
FIX_SCRIPT = REPO / "examples" / "cart" / "model" / "fix.yaml"


def test_serve_prints_its_base_url_serves_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    proc, base_url = started_printing_url(
        [
            *(sys.executable, "-m", "infra.modelserver", "serve", "--script", str(FIX_SCRIPT)),
            *("--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1", "--port", "0"),
        ],
        cwd=REPO,
    )
    try:
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        models = httpx.get(f"{base_url}/models", headers={"Authorization": "Bearer k"}, timeout=10)
        assert models.json()["data"][0]["id"] == "durafix-scripted"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert (tmp_path / "data" / "requests.jsonl").read_text().count("\n") == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_refuses_an_invalid_script_with_exit_code_2(tmp_path: Path) -> None:
    script = tmp_path / "broken.yaml"
    script.write_text("conversations: []\n")
    done = subprocess.run(
        [sys.executable, "-m", "infra.modelserver", "serve", "--script", str(script), "--data-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "conversations" in done.stderr
