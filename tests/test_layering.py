"""The capability packages are libraries: importing every module of one, in a fresh interpreter, loads no
Temporal, no pipeline and no local-stack module (``make lint`` checks the same statically with
import-linter; this proves it at run time, lazy imports included once their module is loaded)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CAPABILITIES = ["reviews", "environments", "browser", "repair", "evidence"]
FORBIDDEN = ("temporalio", "pipeline", "infra")

PROBE = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
names = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("package", CAPABILITIES)
def test_a_capability_loads_no_temporal_pipeline_or_infra_module(package: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, package], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    seen = json.loads(out)
    assert seen["imported"], f"{package} has no modules to import"
    leaked = [m for m in seen["loaded"] if m.split(".")[0] in FORBIDDEN]
    assert not leaked, f"importing {package} loaded {leaked}"
