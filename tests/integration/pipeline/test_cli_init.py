"""``durafix init``: a starter ``durafix.yaml`` guessed from real-shaped projects, read back with the recipe
parser every run uses."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from environments.depcache import CacheKey, DependencyCache
from environments.interface import AppRecipe, ImageRecipe, ReadinessProbe
from environments.spec import dependency_lock_hash, load_recipe
from pipeline.cli import run_command
from pipeline.cli.command import CliError
from pipeline.config import DurafixConfig
from pipeline.failures import FailureClass
from pipeline.services import Services
from pipeline.steps import BaselineInput, CleanupRunInput, PrepareSpecInput, ProvisionInput
from tests.support.gitrepo import make_repo, write_files

PACKAGE_LOCK = {
    "name": "shop",
    "version": "1.0.0",
    "lockfileVersion": 3,
    "requires": True,
    "packages": {
        "": {"name": "shop", "version": "1.0.0", "dependencies": {"express": "^4.19.2"}},
        "node_modules/express": {
            "version": "4.19.2",
            "resolved": "https://registry.npmjs.org/express/-/express-4.19.2.tgz",
            "integrity": "sha512-5T6nhjsT+EOMzuck8JjBHARTHfMht0POzlA60WV2pMD3gyXw2LZnZ+ueGdNxG+0calOJcWKbpFcuzLZ91YWq9Q"
            "==",
        },
    },
}


def write(root: Path, files: dict[str, str]) -> Path:
    """``files`` under ``root``, each dedented (the tests indent them with their code); ``root``."""
    return write_files(root, {rel: textwrap.dedent(text).lstrip() for rel, text in files.items()})


def init(tmp_path: Path, *args: str) -> int:
    return run_command(["--state-dir", str(tmp_path / "state"), "init", *args])


def initialised(tmp_path: Path, repo: Path) -> AppRecipe:
    """``durafix init`` on ``repo`` succeeds; the recipe it wrote, read back."""
    assert init(tmp_path, str(repo)) == 0
    return load_recipe(repo)


def served_recipe(*, deadline_s: int = 30, **fields: Any) -> AppRecipe:
    """A recipe as init guesses it for a served app: its setup may use the network, and it is ready once
    ``GET /`` answers 200 within ``deadline_s``."""
    readiness = ReadinessProbe(path="/", expected_status=200, deadline_s=deadline_s)
    return AppRecipe(setup_network=True, readiness=readiness, **fields)


def node_project(root: Path, scripts: dict[str, str], lock: tuple[str, str] | None) -> Path:
    manifest = {"name": "shop", "version": "1.0.0", "scripts": scripts, "dependencies": {"express": "^4.19.2"}}
    files = {"package.json": json.dumps(manifest, indent=2) + "\n", "server.js": "require('express')().listen(1)\n"}
    if lock is not None:
        files[lock[0]] = lock[1]
    return write(root, files)


def test_an_npm_project_gets_npm_ci_its_test_script_and_its_start_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = node_project(
        tmp_path / "shop",
        {"start": "node server.js", "test": "node --test"},
        ("package-lock.json", json.dumps(PACKAGE_LOCK, indent=2) + "\n"),
    )

    assert init(tmp_path, str(repo)) == 0

    assert load_recipe(repo) == served_recipe(
        deadline_s=60,
        setup=["npm ci"],
        start="npm start",
        port=3000,
        test="npm test",
        lock_files=["package-lock.json"],
        cache=["node_modules"],
        image=ImageRecipe(packages=["nodejs", "npm"]),
    )
    assert dependency_lock_hash(repo, load_recipe(repo)) is not None
    out = capsys.readouterr().out
    assert f"wrote {repo / 'durafix.yaml'} for this npm project (package-lock.json)" in out
    assert "test: npm test (scripts.test: node --test)" in out
    assert "port: 3000 (the usual default; scripts.start names none)" in out
    # What to check is printed and also heads the file.
    for what in ("start: `npm start` must serve the app on $PORT", "port: 3000", "readiness: GET / must answer"):
        assert what in out
        assert what in (repo / "durafix.yaml").read_text()


def test_the_port_comes_from_the_dev_script_and_yarn_and_pnpm_install_frozen(tmp_path: Path) -> None:
    yarn = node_project(
        tmp_path / "yarn-app",
        {"dev": "node server.js --port 8080", "test": "jest"},
        ("yarn.lock", '# yarn lockfile v1\n\nexpress@^4.19.2:\n  version "4.19.2"\n'),
    )
    pnpm = node_project(
        tmp_path / "pnpm-app",
        {"dev": "vite", "test": "vitest run"},
        ("pnpm-lock.yaml", "lockfileVersion: '9.0'\n"),
    )

    assert init(tmp_path, str(yarn)) == 0
    assert init(tmp_path, str(pnpm)) == 0

    yarn_recipe = load_recipe(yarn)
    assert (yarn_recipe.setup, yarn_recipe.start, yarn_recipe.port, yarn_recipe.test) == (
        ["yarn install --frozen-lockfile"],
        "yarn run dev",
        8080,
        "yarn test",
    )
    assert "scripts.dev fixes port 8080" in (yarn / "durafix.yaml").read_text()
    pnpm_recipe = load_recipe(pnpm)
    assert pnpm_recipe.setup == ["pnpm install --frozen-lockfile"]
    # Vite ignores $PORT: it is told the port, and not to move to another one.
    assert pnpm_recipe.start == "pnpm run dev -- --host 0.0.0.0 --port $PORT --strictPort"
    assert (pnpm_recipe.port, pnpm_recipe.test, pnpm_recipe.lock_files) == (5173, "pnpm test", ["pnpm-lock.yaml"])


def test_npms_placeholder_test_script_is_no_test_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = node_project(
        tmp_path / "app",
        {"start": "node server.js", "test": 'echo "Error: no test specified" && exit 1'},
        ("package-lock.json", json.dumps(PACKAGE_LOCK) + "\n"),
    )

    assert init(tmp_path, str(repo)) == 0

    assert "package.json has no real scripts.test" in capsys.readouterr().out


def test_a_pip_project_gets_a_venv_its_requirements_and_pytest_when_it_is_required(tmp_path: Path) -> None:
    repo = write(
        tmp_path / "blog",
        {
            "requirements.txt": "flask==3.0.3\n",
            "requirements-dev.txt": "-r requirements.txt\npytest==8.3.2\n",
            "requirements-docs.txt": "sphinx==7.4.7\n",
            "app.py": """
                from flask import Flask

                app = Flask(__name__)


                @app.get("/")
                def index() -> str:
                    return "posts"
            """,
            "tests/test_app.py": "def test_nothing() -> None:\n    assert True\n",
        },
    )

    # requirements-dev.txt includes requirements.txt: pip installs it through that file.
    assert initialised(tmp_path, repo) == served_recipe(
        setup=["python3 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt"],
        start=".venv/bin/python -m flask --app app:app run --host 0.0.0.0 --port $PORT",
        port=5000,
        test=".venv/bin/python -m pytest",
        test_subset=".venv/bin/python -m pytest {files}",
        lock_files=["requirements.txt", "requirements-dev.txt"],
        cache=[".venv"],
        image=ImageRecipe(packages=["python3", "python3-venv"]),
    )
    assert (
        "- start: `.venv/bin/python -m flask --app app:app run --host 0.0.0.0 --port $PORT` is a guess"
        in (repo / "durafix.yaml").read_text()
    )


def test_a_pip_project_without_pytest_is_tested_with_unittest(tmp_path: Path) -> None:
    repo = write(
        tmp_path / "tool",
        {
            "requirements.txt": "requests==2.32.3\n",
            "server.py": """
                import argparse

                if __name__ == "__main__":
                    parser = argparse.ArgumentParser()
                    parser.add_argument("--port", type=int)
            """,
        },
    )

    recipe = initialised(tmp_path, repo)
    assert recipe.test == ".venv/bin/python -m unittest discover"
    # Only pytest's command line is known to take files and test IDs alike.
    assert recipe.test_subset is None and "test_subset" not in (repo / "durafix.yaml").read_text()
    assert recipe.start == ".venv/bin/python server.py --port $PORT"


def test_a_uv_project_syncs_frozen_and_runs_pytest_through_uv(tmp_path: Path) -> None:
    repo = write(
        tmp_path / "api",
        {
            "pyproject.toml": """
                [project]
                name = "api"
                version = "0.1.0"
                requires-python = ">=3.11"
                dependencies = ["fastapi>=0.115", "uvicorn>=0.30"]

                [dependency-groups]
                dev = ["pytest>=8.3", "httpx>=0.27"]
            """,
            "uv.lock": 'version = 1\nrequires-python = ">=3.11"\n\n[[package]]\nname = "api"\nversion = "0.1.0"\n',
            "src/main.py": "from fastapi import FastAPI\n\napi = FastAPI()\n",
        },
    )

    assert initialised(tmp_path, repo) == served_recipe(
        setup=["uv sync --frozen"],
        start="uv run python -m uvicorn src.main:api --host 0.0.0.0 --port $PORT",
        port=8000,
        test="uv run pytest",
        test_subset="uv run pytest {files}",
        lock_files=["uv.lock"],
        cache=[".venv"],
        image=ImageRecipe(packages=["python3"]),
    )


def test_a_poetry_project_with_pytest_configured(tmp_path: Path) -> None:
    repo = write(
        tmp_path / "svc",
        {
            "pyproject.toml": """
                [tool.poetry]
                name = "svc"
                version = "0.1.0"

                [tool.pytest.ini_options]
                testpaths = ["tests"]
            """,
            "poetry.lock": "# This file is automatically @generated by Poetry.\n",
            "manage.py": "import django\n",
        },
    )

    recipe = initialised(tmp_path, repo)
    assert (recipe.setup, recipe.test, recipe.lock_files) == (["poetry install"], "poetry run pytest", ["poetry.lock"])
    # Poetry keeps its venvs in its cache directory, which the tests' sandbox does not see: in the project instead.
    assert (recipe.env, recipe.cache) == ({"POETRY_VIRTUALENVS_IN_PROJECT": "true"}, [".venv"])
    assert recipe.start == "poetry run python manage.py runserver 0.0.0.0:$PORT --noreload"


def test_an_existing_recipe_is_kept_unless_forced(tmp_path: Path) -> None:
    repo = write(tmp_path / "blog", {"requirements.txt": "flask==3.0.3\n"})
    (repo / "durafix.yaml").write_text("start: mine\ntest: mine\n")

    with pytest.raises(CliError, match=r"durafix.yaml exists; --force overwrites it") as refused:
        init(tmp_path, str(repo))

    assert refused.value.code == 1
    assert (repo / "durafix.yaml").read_text() == "start: mine\ntest: mine\n"
    assert init(tmp_path, str(repo), "--force") == 0
    assert load_recipe(repo).setup == ["python3 -m venv .venv && .venv/bin/pip install -r requirements.txt"]
    # No temporary file is left next to it.
    assert sorted(p.name for p in repo.iterdir()) == ["durafix.yaml", "requirements.txt"]


def test_a_directory_without_a_project_gets_no_file_and_the_reason(tmp_path: Path) -> None:
    repo = write(tmp_path / "docs", {"README.md": "# notes\n"})

    with pytest.raises(CliError, match=r"no package\.json, pyproject\.toml, setup\.py, requirements") as refused:
        init(tmp_path, str(repo))

    assert refused.value.code == 1
    assert not (repo / "durafix.yaml").exists()
    with pytest.raises(CliError, match="is not a directory") as usage:
        init(tmp_path, str(tmp_path / "missing"))
    assert usage.value.code == 2


def test_json_names_the_file_the_recipe_and_the_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = write(tmp_path / "app", {"app.py": 'if __name__ == "__main__":\n    pass\n'})

    assert init(tmp_path, str(repo), "--json") == 0

    doc = json.loads(capsys.readouterr().out)
    assert doc["path"] == str(repo / "durafix.yaml")
    assert doc["project"] == "Python project (no dependencies declared)"
    assert AppRecipe.model_validate(doc["recipe"]) == load_recipe(repo)
    assert any(line.startswith("start: `python3 app.py` must serve the app on $PORT") for line in doc["check"])


def test_an_editable_pip_project_gets_a_setup_check_importing_its_own_package(tmp_path: Path) -> None:
    repo = write(
        tmp_path / "tool",
        {
            "pyproject.toml": """
                [project]
                name = "Shop-Tools"
                version = "0.1.0"
                dependencies = []
            """,
            "src/shop_tools/__init__.py": "VERSION = '0.1.0'\n",
        },
    )

    assert init(tmp_path, str(repo)) == 0

    recipe = load_recipe(repo)
    assert recipe.setup == ["python3 -m venv .venv && .venv/bin/pip install -e ."]
    assert recipe.setup_check == '.venv/bin/python -I -c "import shop_tools"'
    assert "setup_check:" in (repo / "durafix.yaml").read_text()


def test_no_setup_check_is_guessed_when_the_package_is_not_where_its_name_says(tmp_path: Path) -> None:
    repo = write(
        tmp_path / "tool",
        {
            "pyproject.toml": '[project]\nname = "shop-tools"\nversion = "0.1.0"\n',
            "lib/other/__init__.py": "",
        },
    )

    assert init(tmp_path, str(repo)) == 0

    assert load_recipe(repo).setup_check is None


def cache_key(tmp_path: Path, repo: Path) -> CacheKey | str:
    """What the dependency cache makes of the written recipe in ``repo``: its key, or why it caches nothing."""
    cache = DependencyCache(tmp_path / "deps")
    return cache.key_for(repo, load_recipe(repo), repository="acme/lib", provider="local")


def pip_library(root: Path, pyproject_extra: str = "", files: dict[str, str] | None = None) -> Path:
    """A library (no app) on setuptools in a src layout, its tests configured for pytest in pyproject.toml."""
    pyproject = f"""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "Tiny-Lib"
        version = "0.1.0"
        dependencies = ["six==1.16.0"]
        {pyproject_extra}

        [tool.pytest.ini_options]
        testpaths = ["tests"]
    """
    return write(
        root,
        {
            "pyproject.toml": textwrap.dedent(pyproject),
            "src/tiny_lib/__init__.py": "import six\n\n\ndef double(text):\n    return six.text_type(text) * 2\n",
            "tests/test_double.py": "from tiny_lib import double\n\n\ndef test_double():\n"
            "    assert double('a') == 'aa'\n",
            ".gitignore": ".venv/\n*.egg-info/\n",
            **(files or {}),
        },
    )


def test_a_pip_library_installs_its_test_requirements_from_anywhere_and_declares_its_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = pip_library(
        tmp_path / "lib",
        files={
            "requirements/base.txt": "six==1.16.0\n",
            "requirements/test.txt": "-r base.txt\npytest==8.3.2\n",
            "requirements/docs.txt": "sphinx==7.4.7\n",
            "docs/requirements.txt": "sphinx==7.4.7\n",
        },
    )

    recipe = initialised(tmp_path, repo)

    # The project itself (editable: the tests import it) and the test requirements under requirements/; the
    # lock hash covers the file they include; the docs' requirements are left out.
    assert recipe.setup == ["python3 -m venv .venv && .venv/bin/pip install -e . -r requirements/test.txt"]
    assert recipe.test == ".venv/bin/python -m pytest"
    assert recipe.lock_files == ["pyproject.toml", "requirements/base.txt", "requirements/test.txt"]
    # What setup creates is declared: the venv, and the metadata setuptools writes next to the package.
    assert recipe.cache == [".venv", "src/Tiny_Lib.egg-info"]
    key = cache_key(tmp_path, repo)
    assert isinstance(key, CacheKey), key
    assert key.paths == [".venv", "src/Tiny_Lib.egg-info"]
    assert set(key.lock_files) == {"pyproject.toml", "requirements/base.txt", "requirements/test.txt"}
    # A library: no app, so no start, port or readiness at all (not even written), and the file says why.
    assert recipe.start is None
    written = (repo / "durafix.yaml").read_text()
    assert not any(line.startswith(("start:", "port:", "readiness:")) for line in written.splitlines()), written
    out = capsys.readouterr().out
    assert "left out docs/requirements.txt, requirements/docs.txt" in out
    assert "start: no app was found" in out and "start: no app was found" in written
    assert "reproductions of this project's reports will be commands or tests" in written
    assert "readiness: GET /" not in written and "How durafix builds and tests this repository" in written


@pytest.mark.slow
def test_the_written_recipe_of_a_pip_library_sets_up_and_runs_its_tests_for_real(tmp_path: Path) -> None:
    """init on a library whose pytest comes from requirements/test.txt; committed, the recipe's setup installs
    from PyPI (sandboxed, through the dependency cache) and its test command runs pytest on the base; a second
    run of the tests restores the cached setup. The recipe has no start: provisioning an app for it is refused
    (NotReady, naming the missing start) before anything is created."""
    source = pip_library(
        tmp_path / "source",
        files={"requirements/test.txt": "pytest==8.3.2\n", "README.md": "# tiny-lib\n"},
    )
    repo = make_repo(tmp_path / "remote", source)
    assert init(tmp_path, str(repo.work)) == 0
    repo.push_commit("durafix.yaml", (repo.work / "durafix.yaml").read_text(), "durafix recipe")
    config = DurafixConfig(state_dir=tmp_path / "state", evidence_url=(tmp_path / "evidence").as_uri())
    services = Services(config)
    env = services.environment_activities()
    run_id = "repair:acme/tiny-lib#1"
    spec_ref = ActivityEnvironment().run(
        env.prepare_spec,
        PrepareSpecInput(
            run_id=run_id,
            op_id=f"{run_id}:spec",
            repository="acme/tiny-lib",
            clone_url=repo.url,
            base_revision=repo.push_commit("CHANGES.md", "0.1.0\n", "changelog"),
        ),
    )
    try:
        baseline = ActivityEnvironment().run(
            env.run_baseline, BaselineInput(run_id=run_id, op_id=f"{run_id}:baseline", spec_ref=spec_ref)
        )
        log = services.store.read_bytes(baseline.test_output_ref).decode()
        assert baseline.runnable and baseline.passed, log
        assert "1 passed" in log
        # The cache knew what to keep: no "not cached" note, an entry stored.
        assert "# dependency cache: stored entry" in log and "not cached" not in log, log

        again = ActivityEnvironment().run(
            env.run_baseline, BaselineInput(run_id=run_id, op_id=f"{run_id}:baseline-again", spec_ref=spec_ref)
        )
        log = services.store.read_bytes(again.test_output_ref).decode()
        assert again.runnable and again.passed and "# dependency cache: restored entry" in log, log

        with pytest.raises(ApplicationError) as refused:
            ActivityEnvironment().run(
                env.provision, ProvisionInput(run_id=run_id, op_id=f"{run_id}:env-base:1", spec_ref=spec_ref)
            )
        assert refused.value.type == FailureClass.NOT_READY.value and "declares no `start`" in refused.value.message
        assert env.workspaces.list_owned(run_id) == [] and env.provider_for(None).list_owned(run_id) == []
    finally:
        ActivityEnvironment().run(env.cleanup_run, CleanupRunInput(run_id=run_id))


def test_the_tests_requirements_come_from_a_test_extra_a_dependency_group_or_pytest_itself(tmp_path: Path) -> None:
    extra = pip_library(
        tmp_path / "extra",
        '[project.optional-dependencies]\n        docs = ["sphinx"]\n        test = ["pytest>=8"]',
    )
    group = pip_library(
        tmp_path / "group",
        '[dependency-groups]\n        lint = ["ruff"]\n        test = [{include-group = "pins"}]\n'
        '        pins = ["pytest==8.3.2"]',
    )
    bare = pip_library(tmp_path / "bare")

    assert initialised(tmp_path, extra).setup == ["python3 -m venv .venv && .venv/bin/pip install -e '.[test]'"]
    # PEP 735 groups need pip 25.1; the group's include-group is followed to find pytest.
    assert initialised(tmp_path, group).setup == [
        "python3 -m venv .venv && .venv/bin/pip install --upgrade 'pip>=25.1' "
        "&& .venv/bin/pip install -e . --group test"
    ]
    # pytest configured but required nowhere: setup installs it, and the maintainer is told to pin it.
    assert initialised(tmp_path, bare).setup == ["python3 -m venv .venv && .venv/bin/pip install -e . pytest"]
    assert "setup installs the newest pytest" in (bare / "durafix.yaml").read_text()
    for repo in (extra, group, bare):
        key = cache_key(tmp_path, repo)
        assert isinstance(key, CacheKey) and key.paths == [".venv", "src/Tiny_Lib.egg-info"], key


def test_node_recipes_declare_their_cache_yarn_berry_installs_immutable_and_a_library_gets_no_start(
    tmp_path: Path,
) -> None:
    library = node_project(
        tmp_path / "lib",
        {"test": "node --test"},
        ("package-lock.json", json.dumps(PACKAGE_LOCK, indent=2) + "\n"),
    )
    berry_lock = '__metadata:\n  version: 8\n\n"express@npm:^4.19.2":\n  version: 4.19.2\n'
    berry = node_project(tmp_path / "berry", {"start": "node server.js", "test": "jest"}, ("yarn.lock", berry_lock))
    (berry / ".yarnrc.yml").write_text("nodeLinker: node-modules\n")
    pnp = node_project(tmp_path / "pnp", {"start": "node server.js", "test": "jest"}, ("yarn.lock", berry_lock))
    pnpm = node_project(
        tmp_path / "pnpm",
        {"start": "node server.js", "test": "vitest run"},
        ("pnpm-lock.yaml", "lockfileVersion: '9.0'\n"),
    )

    lib = initialised(tmp_path, library)
    assert (lib.start, lib.port, lib.readiness) == (None, 8000, ReadinessProbe())
    assert lib.image.packages == ["nodejs", "npm"]
    assert "start: no app was found" in (library / "durafix.yaml").read_text()
    assert (lib.setup, lib.cache) == (["npm ci"], ["node_modules"])
    berry_recipe = initialised(tmp_path, berry)
    assert (berry_recipe.setup, berry_recipe.cache) == (
        ["yarn install --immutable"],
        ["node_modules", ".yarn/install-state.gz"],
    )
    # Plug'n'Play leaves no node_modules: caching is declared off, and the file says why.
    assert initialised(tmp_path, pnp).cache == []
    assert "yarn Plug'n'Play" in (pnp / "durafix.yaml").read_text()
    assert initialised(tmp_path, pnpm).cache == ["node_modules"]
    for repo in (library, berry, pnpm):
        assert isinstance(cache_key(tmp_path, repo), CacheKey)
    assert cache_key(tmp_path, pnp) == "not cached: the recipe declares cache: []"
