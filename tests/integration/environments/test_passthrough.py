"""Which worker variables setup commands see: the operator's patterns, durafix's own secrets never, and nothing of
it for the app or the tests. Environments are read back from what the commands themselves wrote."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from environments.checks import PACKAGE_CACHE_VARS, THROWAWAY_PREFIX, SetupError, SetupSettings, run_setup, run_tests
from environments.files import path_key
from environments.interface import AppRecipe, RecoverySpec
from environments.local import LocalProcessProvider
from environments.passthrough import (
    DEFAULT_PATTERNS,
    PassthroughError,
    check_patterns,
    holds_url_credentials,
    never_passed,
    parse_patterns,
    passed_through,
    screen,
)
from environments.sandbox import Sandbox
from environments.spec import load_recipe
from pipeline.config import DurafixConfig, load_config
from tests.support.gitrepo import CART_APP, git

RUN = "repair:acme/cart#70"
WORKER_VARS = {
    "PIP_INDEX_URL": "https://pypi.internal.example/simple",
    "HTTPS_PROXY": "http://proxy.internal.example:3128",
    "npm_config_registry": "https://npm.internal.example/",
    "PIP_PASSWORD": "pip-secret",
    "npm_config__authToken": "npm-secret",
    "DURAFIX_FORGE_TOKEN": "forge-secret",
    "OPENAI_API_KEY": "model-secret",
    "UNRELATED_SETTING": "not asked for",
}


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("*", "DURAFIX_"),
        ("*_PROXY", "DURAFIX_"),
        ("D*", "DURAFIX_"),
        ("DURAFIX_STATE_DIR", "DURAFIX_"),
        ("?URAFIX_*", "DURAFIX_"),
        ("[DX]URAFIX_*", "DURAFIX_"),
        ("OPENAI_*", "OPENAI_"),
        ("openai_*", "OPENAI_"),
        ("NPM_TOKEN", "credential"),
        ("GITHUB_TOKEN", "credential"),
        ("PIP_PASSWORD", "credential"),
        ("AWS_SECRET_ACCESS_KEY", "credential"),
        ("npm_config__auth", "credential"),
        ("PIP INDEX", "not a variable-name glob"),
    ],
)
def test_patterns_that_could_reach_durafixs_secrets_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(PassthroughError, match=why):
        parse_patterns(f"PIP_*,{pattern}")


def test_the_default_patterns_and_the_variables_form_are_accepted() -> None:
    assert check_patterns(DEFAULT_PATTERNS) == DEFAULT_PATTERNS
    assert parse_patterns(" PIP_*, HTTPS_PROXY,,PIP_* ") == ("PIP_*", "HTTPS_PROXY")
    assert parse_patterns("none") == ()
    assert parse_patterns("") == ()


def test_matching_variables_pass_but_never_durafixs_own_or_credentials() -> None:
    passed = passed_through(["PIP_*", "HTTPS_PROXY", "npm_config_*"], {**WORKER_VARS, "GIT_AUTHOR_NAME": "x"})
    assert passed == {
        "PIP_INDEX_URL": WORKER_VARS["PIP_INDEX_URL"],
        "HTTPS_PROXY": WORKER_VARS["HTTPS_PROXY"],
        "npm_config_registry": WORKER_VARS["npm_config_registry"],
    }
    assert never_passed("UV_INDEX_PRIVATE_PASSWORD") and never_passed("durafix_x") and not never_passed("UV_CACHE_DIR")


@pytest.mark.parametrize(
    "value",
    [
        "https://user:token@pypi.internal.example/simple",
        "https://token@pypi.internal.example/simple",
        "http://user:pass@proxy.internal.example:3128",
        "user:pass@proxy.internal.example:3128",
        "https://pypi.org/simple https://ci:token@private.example/simple",
        "https://pypi.org/simple,https://ci:token@private.example/simple",
        "https://pypi.org/simple\n\thttps://ci:tok/en@private.example/simple",
        "git+https://ci:token@git.example/pkg.git",
    ],
)
def test_a_url_with_credentials_is_recognised_alone_or_in_a_list(value: str) -> None:
    assert holds_url_credentials(value)


@pytest.mark.parametrize(
    "value",
    [
        "https://pypi.internal.example/simple",
        "https://pypi.org/simple https://mirror.example/simple",
        "http://proxy.internal.example:3128",
        "localhost,127.0.0.1,.internal.example",
        "me@example.com",
        "/etc/ssl/certs/ca.pem",
        "",
    ],
)
def test_values_without_credentials_are_not_taken_for_them(value: str) -> None:
    assert not holds_url_credentials(value)


LEAKY_VARS = {
    "PIP_INDEX_URL": "https://pypi.internal.example/simple",
    "PIP_EXTRA_INDEX_URL": "https://pypi.org/simple https://ci:idx-token-123@private.example/simple",
    "npm_config_registry": "https://deploy:npm-token-456@npm.internal.example/",
    "HTTPS_PROXY": "http://proxyuser:proxy-pass-789@proxy.internal.example:3128",
}


def test_a_glob_never_passes_a_url_with_credentials_and_says_which_variable_without_its_value() -> None:
    screened = screen(("PIP_*", "npm_config_*"), LEAKY_VARS)
    assert screened.env == {"PIP_INDEX_URL": "https://pypi.internal.example/simple"}
    assert screened.withheld == ("PIP_EXTRA_INDEX_URL", "npm_config_registry")
    [pip, npm] = screened.warnings()
    assert "PIP_EXTRA_INDEX_URL was not passed" in pip and "credentials" in pip
    assert "npm_config_registry was not passed" in npm
    for warning in screened.warnings():
        for secret in ("idx-token-123", "npm-token-456", "private.example", "npm.internal.example"):
            assert secret not in warning


def test_a_variable_the_operator_names_exactly_passes_even_with_credentials() -> None:
    screened = screen(("PIP_*", "PIP_EXTRA_INDEX_URL", "HTTPS_PROXY"), LEAKY_VARS)
    assert screened.env == {name: LEAKY_VARS[name] for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "HTTPS_PROXY")}
    assert screened.withheld == ()
    # The default list names HTTPS_PROXY, but durafix wrote it, not the operator: a proxy password stays out.
    default = screen(DEFAULT_PATTERNS, LEAKY_VARS)
    assert set(default.env) == {"PIP_INDEX_URL"}
    assert default.withheld == ("HTTPS_PROXY", "PIP_EXTRA_INDEX_URL", "npm_config_registry")
    # Naming a variable exactly never reaches what is withheld by name.
    assert screen(("PIP_EXTRA_INDEX_URL",), {"PIP_EXTRA_INDEX_URL": "x", "PIP_PASSWORD": "y"}).env == {
        "PIP_EXTRA_INDEX_URL": "x"
    }


def test_the_setting_is_read_from_the_environment_and_a_dangerous_pattern_stops_the_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DURAFIX_SETUP_PASSTHROUGH", raising=False)
    assert load_config(tmp_path).setup_passthrough == list(DEFAULT_PATTERNS)
    monkeypatch.setenv("DURAFIX_SETUP_PASSTHROUGH", "PIP_INDEX_URL,HTTPS_PROXY")
    assert load_config(tmp_path).setup_passthrough == ["PIP_INDEX_URL", "HTTPS_PROXY"]
    monkeypatch.setenv("DURAFIX_SETUP_PASSTHROUGH", "none")
    assert load_config(tmp_path).setup_passthrough == []
    monkeypatch.setenv("DURAFIX_SETUP_PASSTHROUGH", "PIP_*,*")
    with pytest.raises(ValidationError, match=r"pattern '\*' could match durafix's own DURAFIX_\* variables"):
        load_config(tmp_path)
    monkeypatch.delenv("DURAFIX_SETUP_PASSTHROUGH")
    (tmp_path / "config.json").write_text(json.dumps({"setup_passthrough": ["PIP_*", "GH_TOKEN"]}))
    with pytest.raises(ValidationError, match="GH_TOKEN"):
        load_config(tmp_path)
    with pytest.raises(PassthroughError):
        SetupSettings(passthrough=("OPENAI_BASE_URL",))
    saved = DurafixConfig(state_dir=tmp_path / "saved", setup_passthrough=["UV_*"])
    saved.save()
    assert load_config(tmp_path / "saved").setup_passthrough == ["UV_*"]


@pytest.fixture
def worker_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in WORKER_VARS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(CART_APP, ws, ignore=shutil.ignore_patterns("__pycache__"))
    return ws


def dumped(path: Path) -> dict[str, str]:
    """The environment a command wrote with ``python3 -c 'import json, os; ...'``."""
    data: dict[str, str] = json.loads(path.read_text())
    return data


DUMP = "python3 -c 'import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], \"w\"))'"


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[LocalProcessProvider]:
    settings = SetupSettings(package_caches=tmp_path / "packages", passthrough=("PIP_*", "HTTPS_PROXY", "npm_config_*"))
    prov = LocalProcessProvider(tmp_path / "state", stop_grace_s=2.0, setup=settings)
    yield prov
    prov.cleanup_run(RUN)


@pytest.mark.usefixtures("worker_vars")
def test_only_setup_sees_the_passed_variables_and_the_package_caches(
    provider: LocalProcessProvider, workspace: Path, tmp_path: Path
) -> None:
    recipe = load_recipe(CART_APP).model_copy(
        update={
            "setup": [f"{DUMP} setup.json"],
            "start": f"{DUMP} app.json && exec python3 app.py --port $PORT",
            "fixtures": [f"{DUMP} fixture.json"],
            "test": f"{DUMP} tests.json",
        }
    )
    # A checkout of its base revision (a candidate's workspace gets a throwaway package cache instead).
    git("init", "-q", cwd=workspace)
    git("add", "-A", cwd=workspace)
    git("commit", "-qm", "base", cwd=workspace)
    git("update-ref", "--no-deref", "HEAD", git("rev-parse", "HEAD", cwd=workspace), cwd=workspace)
    base = git("rev-parse", "HEAD", cwd=workspace)
    spec = RecoverySpec(
        repository="acme/cart", clone_url="https://example.com/c.git", base_revision=base, recipe=recipe
    )
    provider.provision(run_id=RUN, op_id=f"{RUN}:env", spec=spec, workspace=str(workspace))
    assert run_tests(workspace, recipe, 60, log_path=tmp_path / "tests.log").passed

    setup = dumped(workspace / "setup.json")
    assert {name: setup[name] for name in ("PIP_INDEX_URL", "HTTPS_PROXY", "npm_config_registry")} == {
        name: WORKER_VARS[name] for name in ("PIP_INDEX_URL", "HTTPS_PROXY", "npm_config_registry")
    }
    # The repository's own package caches: its lock files (none) are the base revision's.
    packages = tmp_path / "packages" / path_key("acme/cart")
    for variable, directory in PACKAGE_CACHE_VARS.items():
        assert setup[variable] == str(packages / directory)
        assert (packages / directory).is_dir()
    for secret in (
        "PIP_PASSWORD",
        "npm_config__authToken",
        "DURAFIX_FORGE_TOKEN",
        "OPENAI_API_KEY",
        "UNRELATED_SETTING",
    ):
        assert secret not in setup
    for other in ("app.json", "fixture.json", "tests.json"):
        env = dumped(workspace / other)
        assert not set(env) & {*WORKER_VARS, *PACKAGE_CACHE_VARS}, other


@pytest.mark.usefixtures("worker_vars")
def test_a_variable_the_operator_passes_wins_over_the_package_cache_location(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "operators-pip-cache"))
    recipe = AppRecipe(setup=[f"{DUMP} setup.json"], start="true", test="true", env={"HTTPS_PROXY": "from-recipe"})
    settings = SetupSettings(package_caches=tmp_path / "packages", passthrough=("PIP_*", "HTTPS_PROXY"))
    run_setup(
        workspace,
        recipe,
        marker=f"test/{uuid.uuid4().hex}",
        log_path=tmp_path / "s.log",
        timeout_s=30,
        settings=settings,
    )

    setup = dumped(workspace / "setup.json")
    assert setup["PIP_CACHE_DIR"] == str(tmp_path / "operators-pip-cache")
    # No repository named: a package cache of its own, gone when setup is.
    uv = Path(setup["UV_CACHE_DIR"])
    assert uv.name == "uv" and uv.parent.parent == tmp_path / "packages"
    assert uv.parent.name.startswith(THROWAWAY_PREFIX) and not uv.parent.exists()
    # The recipe's own env is the repository's word about its commands and stays on top.
    assert setup["HTTPS_PROXY"] == "from-recipe"


def probe_wheel(directory: Path) -> str:
    """A pure-Python wheel that exists nowhere but in ``directory``; returns the distribution's name."""
    name, version = "durafix_passthrough_probe", "1.0"
    files = {
        f"{name}.py": "VALUE = 42\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join([*record, f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    directory.mkdir(parents=True)
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    return name


@pytest.mark.slow
def test_pip_configured_only_through_the_workers_variables_installs_when_they_are_passed(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = probe_wheel(tmp_path / "wheels")
    # The worker's pip is configured by its environment alone: an index of its own (here a directory).
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    recipe = AppRecipe(
        setup=["test -x .venv/bin/pip || python3 -m venv .venv", f".venv/bin/pip install --quiet {name}"],
        start="true",
        test="true",
    )

    def setup(passthrough: tuple[str, ...], log: str) -> None:
        run_setup(
            workspace,
            recipe,
            marker=f"test/{uuid.uuid4().hex}",
            log_path=tmp_path / log,
            timeout_s=300,
            settings=SetupSettings(package_caches=tmp_path / "packages", passthrough=passthrough),
        )

    with pytest.raises(SetupError, match=f"Could not find a version that satisfies the requirement {name}"):
        setup((), "without.log")
    setup(("PIP_*",), "with.log")
    [installed] = (workspace / ".venv").glob(f"lib/python3*/site-packages/{name}.py")
    assert installed.read_text() == "VALUE = 42\n"


def test_a_sandboxed_setup_command_never_sees_a_credential_a_glob_matched(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name, value in LEAKY_VARS.items():
        monkeypatch.setenv(name, value)
    sandbox = Sandbox.detect()
    assert sandbox.sandboxed, "setup must run in bubblewrap here"
    # The setup command tries everything a hostile one would: its environment, and the worker's own
    # environment through /proc (outside its PID namespace, so it sees none of it).
    probe = (
        "python3 -c 'import json, os, sys, glob; "
        "env = dict(os.environ); "
        'procs = [open(p, "rb").read().decode("latin-1") for p in glob.glob("/proc/[0-9]*/environ") '
        "if os.access(p, os.R_OK)]; "
        'json.dump({"env": env, "procs": procs}, open(sys.argv[1], "w"))\' seen.json'
    )
    recipe = AppRecipe(setup=[probe], start="true", test="true")

    def setup(passthrough: tuple[str, ...], log: str) -> dict[str, object]:
        run_setup(
            workspace,
            recipe,
            marker=f"test/{uuid.uuid4().hex}",
            log_path=tmp_path / log,
            timeout_s=60,
            sandbox=sandbox,
            settings=SetupSettings(package_caches=tmp_path / "packages", passthrough=passthrough),
        )
        seen: dict[str, object] = json.loads((workspace / "seen.json").read_text())
        return seen

    with caplog.at_level("WARNING", logger="environments.checks"):
        seen = setup(("PIP_*", "npm_config_*"), "glob.log")
    env = seen["env"]
    assert isinstance(env, dict)
    assert env["PIP_INDEX_URL"] == LEAKY_VARS["PIP_INDEX_URL"]
    assert "PIP_EXTRA_INDEX_URL" not in env and "npm_config_registry" not in env
    procs = seen["procs"]
    assert isinstance(procs, list) and any("PIP_INDEX_URL=" in text for text in procs)  # it read its own, at least
    everything_setup_wrote = (workspace / "seen.json").read_text()
    for secret in ("idx-token-123", "npm-token-456", "proxy-pass-789"):
        assert secret not in everything_setup_wrote
    log = (tmp_path / "glob.log").read_text()
    assert "PIP_EXTRA_INDEX_URL was not passed to setup" in log
    assert "npm_config_registry was not passed to setup" in log
    assert "PIP_EXTRA_INDEX_URL was not passed to setup" in caplog.text
    for secret in ("idx-token-123", "npm-token-456"):
        assert secret not in log and secret not in caplog.text

    # Named exactly, the operator's choice: that one variable passes, and only it.
    seen = setup(("PIP_*", "PIP_EXTRA_INDEX_URL"), "exact.log")
    env = seen["env"]
    assert isinstance(env, dict)
    assert env["PIP_EXTRA_INDEX_URL"] == LEAKY_VARS["PIP_EXTRA_INDEX_URL"]
    assert "npm-token-456" not in (workspace / "seen.json").read_text()
    assert "was not passed" not in (tmp_path / "exact.log").read_text()
