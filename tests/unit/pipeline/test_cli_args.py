"""Argument parsing of the ``durafix`` command line."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore
from pipeline.cli import COMMANDS, build_parser, command_specs, run_command
from pipeline.cli.command import CliError
from pipeline.cli.durations import parse_duration
from pipeline.cli.run_ids import is_run_id, run_id_from, run_ref


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("1.5d", timedelta(hours=36)),
    ],
)
def test_durations_take_one_unit(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "h", "2", "2w", "-1h", "0m", "soonh"])
def test_bad_durations_are_refused_with_the_accepted_form(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="a positive number and one of s, m, h, d"):
        parse_duration(text)


def test_approve_takes_a_validity(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["approve", "acme/shop#1", "--sha", "a" * 40, "--valid-for", "2h"])
    assert args.valid_for == timedelta(hours=2)
    assert build_parser().parse_args(["approve", "acme/shop#1", "--sha", "a" * 40]).valid_for is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["approve", "acme/shop#1", "--sha", "a" * 40, "--valid-for", "later"])
    assert "bad duration 'later'" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(command_specs()))
def test_every_command_answers_help_with_its_own_usage(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run_command([command, "--help"])

    assert exited.value.code == 0
    usage = capsys.readouterr().out.splitlines()[0]
    # model hands its arguments, --help included, to the server's own parser; forge answers --help itself
    # (its repository-setup commands) and hands `serve` to the emulator's.
    prog = "model" if command == "model" else f"durafix {command}"
    assert usage.startswith(f"usage: {prog} ")


def test_arguments_only_a_pass_through_command_takes_are_a_usage_error_elsewhere(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_command(["list", "--data-dir", "x"])

    assert exited.value.code == 2
    assert "durafix: error: unrecognized arguments: --data-dir x" in capsys.readouterr().err


def test_the_state_dir_option_is_the_configuration_the_command_gets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DURAFIX_STATE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.delenv("DURAFIX_EVIDENCE_URL", raising=False)
    store = LocalArtifactStore(tmp_path / "state" / "evidence")
    log = store.put_bytes(b"log", kind=ArtifactKind.LOG, run_id="r")

    code = run_command(["--state-dir", str(tmp_path / "state"), "evidence", "gc", "--keep", "log=0"])

    assert code == 0
    assert capsys.readouterr().out.split() == [log.key]
    assert not store.exists(log)
    assert not (tmp_path / "elsewhere").exists()


def test_run_ids_are_taken_with_or_without_their_prefix_and_checked_only_where_asked() -> None:
    assert run_ref("acme/shop#12") == run_id_from("acme/shop#12") == "repair:acme/shop#12"
    assert run_ref("repair:acme/shop#12") == "repair:acme/shop#12"
    # Run commands leave a malformed ID to Temporal (not found); --run of the on-call commands refuses it.
    assert run_ref("shop#1") == "repair:shop#1"
    with pytest.raises(ValueError, match="not a durafix workflow ID"):
        run_id_from("shop#1")
    assert is_run_id("repair:acme/shop#12")
    assert not is_run_id("manual-experiment") and not is_run_id("acme/shop#12")


@pytest.mark.parametrize("argv", [["dev", "status"], ["forge", "serve"], ["model", "serve"]])
def test_without_the_local_stack_the_dev_commands_say_they_run_from_a_source_checkout(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in an installed wheel, which carries the product packages only (what earlier tests imported included).
    for name in [name for name in sys.modules if name.startswith("infra.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "infra", None)

    with pytest.raises(CliError, match="`durafix dev` and `demo` run from a source checkout") as refused:
        run_command(["--state-dir", str(tmp_path), *argv])

    assert refused.value.code == 1
    assert f"`durafix {argv[0]}` needs the local stack" in str(refused.value)


def _distribution(root: Path, entry_points: dict[str, str]) -> None:
    """A distribution on ``root`` whose only content is its ``durafix.commands`` entry points."""
    info = root / "durafix_plugin_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: durafix-plugin-probe\nVersion: 0\n")
    lines = "".join(f"{name} = {module}\n" for name, module in entry_points.items())
    (info / "entry_points.txt").write_text(f"[durafix.commands]\n{lines}")


def test_the_local_stacks_commands_come_from_entry_points_and_replace_the_products_forge() -> None:
    specs = command_specs()

    assert {"dev", "demo", "model", "chaos"} <= set(specs)
    assert specs["dev"].module == specs["demo"].module == specs["model"].module == "infra.cli.dev"
    assert specs["chaos"].module == "infra.cli.chaos"
    assert specs["forge"].module == "infra.cli.dev"
    # The product's own table names no module of the local stack.
    assert not any(spec.module.startswith("infra.") for spec in COMMANDS.values())


def test_a_command_whose_module_is_missing_is_listed_and_refuses_but_never_hides_a_product_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _distribution(tmp_path, {"ghost": "absent_stack.cli", "reconcile": "absent_stack.cli"})
    monkeypatch.syspath_prepend(str(tmp_path))

    specs = command_specs()

    assert specs["ghost"].passes_through
    assert specs["reconcile"].module == "pipeline.cli.reconcile"
    with pytest.raises(CliError, match="`durafix ghost` needs the local stack") as refused:
        run_command(["--state-dir", str(tmp_path), "ghost", "up", "--fast"])
    assert refused.value.code == 1


def test_a_command_module_that_fails_to_import_something_else_is_an_error_not_an_absent_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_stack_probe.py").write_text("import a_module_nobody_installed_probe\n")
    _distribution(tmp_path, {"broken": "broken_stack_probe"})
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(ModuleNotFoundError, match="a_module_nobody_installed_probe"):
        command_specs()
