"""The loop's tool handling seen from the model's side: what it is sent back, what reaches the workspace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from repair.openai_calls import OP_ID_HEADER
from tests.support.modelserver import Serve, recorded, tool_turn
from tests.support.repair import CART_SCRIPTS, engine_for, git, request_for


def one_conversation(*turns: dict[str, Any]) -> dict[str, Any]:
    return {"conversations": [{"name": "probe", "turns": list(turns)}]}


def tool_results(server_records: list[dict[str, Any]]) -> list[str]:
    """The tool messages of the last request: every result the model was sent, in order."""
    return [m["content"] for m in server_records[-1]["body"]["messages"] if m["role"] == "tool"]


def test_escape_attempts_are_refused_to_the_model_and_change_nothing(
    serve: Serve, cart_repo: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP-SECRET\n")
    (cart_repo / "escape").symlink_to(outside)
    git(cart_repo, "add", "escape")
    git(cart_repo, "commit", "-q", "-m", "a symlink out of the repository")
    server = serve(
        one_conversation(
            tool_turn("read_file", path="../outside/secret.txt"),
            tool_turn("read_file", path=str(outside / "secret.txt")),
            tool_turn("read_file", path="escape/secret.txt"),
            tool_turn("write_file", path="escape/planted.txt", content="x"),
            tool_turn("write_file", path=".git/hooks/pre-commit", content="#!/bin/sh\n"),
            tool_turn("replace_in_file", path=".git/HEAD", old="ref", new="xx"),
            tool_turn("list_files", path=".."),
            tool_turn("write_file", path="NOTES.md", content="legit\n"),
            tool_turn("finish", summary="probed"),
        )
    )
    proposal = engine_for(server.base_url).propose(request_for(cart_repo))

    results = tool_results(recorded(server))
    assert all(r.startswith("error: ") for r in results[:7]), results
    assert "TOP-SECRET" not in json.dumps(recorded(server))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert not (cart_repo / ".git" / "hooks" / "pre-commit").exists()
    assert (cart_repo / ".git" / "HEAD").read_text().startswith("ref: ")
    assert proposal.files_changed == ["NOTES.md"]


def test_malformed_calls_get_error_results_and_the_model_can_carry_on(serve: Serve, cart_repo: Path) -> None:
    server = serve(
        one_conversation(
            tool_turn("delete_everything", path="."),
            tool_turn("replace_in_file", path="cart.py"),
            tool_turn("replace_in_file", path="cart.py", old="return", new="yield"),
            tool_turn("write_file", path="NOTES.md", content="ok\n"),
            tool_turn("finish", summary="carried on"),
        )
    )
    proposal = engine_for(server.base_url).propose(request_for(cart_repo))
    results = tool_results(recorded(server))
    assert results[0].startswith("error: unknown tool 'delete_everything'")
    assert results[1] == "error: replace_in_file: missing or non-string argument(s): old, new"
    assert "must match exactly once" in results[2]
    assert proposal.summary == "carried on"
    assert proposal.files_changed == ["NOTES.md"]


def test_the_model_is_sent_tool_results_schemas_and_the_operation_id(serve: Serve, cart_repo: Path) -> None:
    server = serve(CART_SCRIPTS / "fix.yaml")
    turns: list[int] = []
    engine_for(server.base_url, on_turn=turns.append).propose(request_for(cart_repo))

    records = recorded(server)
    assert turns == [1, 2, 3, 4, 5, 6]
    assert {r["headers"][OP_ID_HEADER.lower()] for r in records} == {"repair:shop/cart#7:repair:1"}
    first = records[0]["body"]
    assert {t["function"]["name"] for t in first["tools"]} == {
        "list_files",
        "read_file",
        "search",
        "replace_in_file",
        "write_file",
        "finish",
    }
    assert first["messages"][1]["content"].startswith("Bug report: Cart total ignores quantities")
    results = tool_results(records)
    assert (
        results[0]
        == "cart.py:16: def line_total(item: Item) -> int:\ncart.py:20: def compute_total(items: list[Item]) -> int:"
    )
    assert results[1] == (cart_repo / "cart.py").read_text().replace(
        "line_total(item) for", "item.unit_price_cents for"
    )
    assert results[2] == "replaced 1 occurrence in cart.py"


def test_a_model_that_stops_talking_is_finished_with_its_last_words(serve: Serve, cart_repo: Path) -> None:
    server = serve(
        one_conversation(tool_turn("write_file", path="NOTES.md", content="x\n"), {"content": "Wrote the notes."})
    )
    proposal = engine_for(server.base_url).propose(request_for(cart_repo))
    assert (proposal.summary, proposal.turns, proposal.tool_calls) == ("Wrote the notes.", 2, 1)
