"""The adapter for mini-swe-agent (PyPI ``mini-swe-agent``), pinned, in a virtual environment of its own.

How it is run: ``mini`` with the ``default`` agent class (the ``interactive`` one asks a human to confirm
commands and the exit), ``--exit-immediately``, the text-based model (``litellm_textbased``: the model answers
in plain chat completions with exactly one fenced ``mswea_bash_command`` block per reply, which it runs in a
fresh ``sh`` in the workspace), ``openai/<model>`` through litellm against ``OPENAI_BASE_URL``. The agent ends
when a command prints ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` as its first line (the text after it is the
submission, our summary), after ``step_limit`` model calls, or after three replies in a row without exactly one
command. ``MSWEA_CONFIGURED`` skips its first-run questions; its cost tracking is off (durafix counts tokens at
its proxy, and a private model has no price list), and litellm uses its bundled model list instead of
fetching one.

Installation: :func:`install` builds ``TOOLS/mini-swe-agent-<VERSION>`` with ``uv`` from PyPI on the system
interpreter (``/usr/bin/python3``, so the sandbox, which sees ``/usr`` but not the worker's own Python, can run
it). Idempotent: a finished environment is marked and reused; a half-built one is removed and rebuilt.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from repair.agent_command import Invocation, base_env, bounded_summary, read_agent_file
from repair.interface import RepairRequest

PACKAGE = "mini-swe-agent"
VERSION = "2.4.6"
SYSTEM_PYTHON = "/usr/bin/python3"
STEP_LIMIT = 30
# A trajectory holds every turn; one bigger than this is not read (the attempt's summary says so).
MAX_TRAJECTORY_READ = 32 * 1024 * 1024
TRAJECTORY = "trajectory.json"
_READY = ".durafix-ready"


class InstallError(RuntimeError):
    """The agent's environment could not be built (no ``uv``, no system Python, or the install failed)."""


def venv_dir(tools_dir: Path) -> Path:
    return tools_dir / f"{PACKAGE}-{VERSION}"


def install(tools_dir: Path, uv: str | None = None) -> Path:
    """The virtual environment holding ``mini-swe-agent==VERSION`` under ``tools_dir``, built on first use.

    Idempotent and safe across processes: builds are serialised by a lock file beside the environment, so two
    workers (or test sessions) on one host build it once and the second finds it ready."""
    venv = venv_dir(tools_dir)
    if (venv / _READY).exists():
        return venv
    tools_dir.mkdir(parents=True, exist_ok=True)
    with (tools_dir / f"{venv.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when a killed holder's process ends
        if (venv / _READY).exists():
            return venv
        _build(venv, tools_dir, uv)
    return venv


def _build(venv: Path, tools_dir: Path, uv: str | None) -> None:
    # ``UV`` is set by ``uv run`` to its own binary; otherwise the one on PATH, or where pip --user puts it.
    uv = uv or os.environ.get("UV") or shutil.which("uv") or os.path.expanduser("~/.local/bin/uv")
    if not Path(uv).exists():
        raise InstallError("installing mini-swe-agent needs uv (pip install uv)")
    if not Path(SYSTEM_PYTHON).exists():
        raise InstallError(f"mini-swe-agent runs on the system interpreter {SYSTEM_PYTHON}, which is missing")
    shutil.rmtree(venv, ignore_errors=True)
    tools_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    for argv in (
        [uv, "venv", "--quiet", "--python", SYSTEM_PYTHON, str(venv)],
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), f"{PACKAGE}=={VERSION}"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
        if done.returncode != 0:
            raise InstallError(f"{' '.join(argv[:3])} failed: {done.stderr.strip()[-600:]}")
    (venv / _READY).write_text(VERSION + "\n")


@dataclass(frozen=True)
class MiniSweAgent:
    """mini-swe-agent from the virtual environment ``venv`` (see :func:`install`)."""

    venv: Path
    step_limit: int = STEP_LIMIT
    name: str = PACKAGE

    def invocation(
        self, request: RepairRequest, *, workspace: Path, agent_dir: Path, base_url: str, api_key: str, model: str
    ) -> Invocation:
        env = base_env(request, agent_dir=agent_dir, base_url=base_url, api_key=api_key, model=model)
        env.update(
            {
                "MSWEA_CONFIGURED": "true",
                "MSWEA_SILENT_STARTUP": "1",
                "MSWEA_GLOBAL_CONFIG_DIR": str(agent_dir / "config"),
                "MSWEA_COST_TRACKING": "ignore_errors",
                "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "OPENAI_API_BASE": base_url,
                "NO_COLOR": "1",
                "TERM": "dumb",
            }
        )
        argv = [
            str(self.venv / "bin" / "mini"),
            "--agent-class",
            "default",
            "--model-class",
            "litellm_textbased",
            "--model",
            f"openai/{model}",
            "--exit-immediately",
            "--yolo",
            "--config",
            "mini_textbased.yaml",
            "--config",
            f"agent.step_limit={self.step_limit}",
            "--config",
            "agent.cost_limit=0",
            "--config",
            f"environment.cwd={json.dumps(str(workspace))}",
            "--output",
            str(agent_dir / TRAJECTORY),
            "--task",
            env["DURAFIX_TASK"],
        ]
        return Invocation(argv=argv, env=env, read_only=(self.venv,))

    def summary(self, agent_dir: Path) -> str:
        """The agent's submission (the text after its completion marker), else how it exited."""
        said = read_agent_file(agent_dir, TRAJECTORY, MAX_TRAJECTORY_READ)
        try:
            info = json.loads(said).get("info", {}) if said else None
        except ValueError:
            info = None
        if not isinstance(info, dict):
            return "mini-swe-agent finished without writing its trajectory (or it was a link, not JSON, or too big)"
        exited = f"mini-swe-agent exited: {str(info.get('exit_status') or 'unknown')[:100]}"
        return bounded_summary(str(info.get("submission") or ""), exited)
