"""How the engine classifies what goes wrong, against the scripted server over real HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repair.interface import ModelPermanentError, ModelTransientError, NoPatchError, RepairBudgetError
from tests.support.modelserver import Serve, inject_fault, recorded, tool_turn
from tests.support.repair import CART_SCRIPTS, engine_for, request_for

FIX = CART_SCRIPTS / "fix.yaml"


def test_rate_limit_is_transient_and_carries_retry_after(serve: Serve, cart_repo: Path) -> None:
    server = serve(FIX)
    inject_fault(server, status=429, retry_after=7)
    with pytest.raises(ModelTransientError) as caught:
        engine_for(server.base_url).propose(request_for(cart_repo))
    assert (caught.value.status, caught.value.retry_after) == (429, 7.0)
    assert len(recorded(server)) == 1  # the SDK did not retry on its own


def test_server_error_is_transient_without_retry_after(serve: Serve, cart_repo: Path) -> None:
    server = serve(FIX)
    inject_fault(server, status=500)
    with pytest.raises(ModelTransientError) as caught:
        engine_for(server.base_url).propose(request_for(cart_repo))
    assert (caught.value.status, caught.value.retry_after) == (500, None)


def test_timeout_is_transient(serve: Serve, cart_repo: Path) -> None:
    server = serve(FIX)
    inject_fault(server, delay_s=30)
    with pytest.raises(ModelTransientError, match=r"timed out after 0\.5s"):
        engine_for(server.base_url, timeout_s=0.5).propose(request_for(cart_repo))


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port that is bound but never listens, so connecting to it is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


def test_unreachable_endpoint_is_transient(refusing_port: int, cart_repo: Path) -> None:
    with pytest.raises(ModelTransientError, match="cannot reach the model endpoint"):
        engine_for(f"http://127.0.0.1:{refusing_port}/v1").propose(request_for(cart_repo))


def test_wrong_api_key_is_permanent(serve: Serve, cart_repo: Path, tmp_path: Path) -> None:
    script = tmp_path / "keyed.yaml"
    script.write_text(FIX.read_text() + "api_key: the-real-key\n")
    server = serve(script)
    with pytest.raises(ModelPermanentError) as caught:
        engine_for(server.base_url, api_key="a-wrong-key").propose(request_for(cart_repo))
    assert caught.value.status == 401


def test_unknown_model_is_permanent(serve: Serve, cart_repo: Path) -> None:
    server = serve(FIX)
    with pytest.raises(ModelPermanentError) as caught:
        engine_for(server.base_url, model="no-such-model").propose(request_for(cart_repo))
    assert caught.value.status == 404


def test_unmatched_script_is_permanent_and_says_so(serve: Serve, cart_repo: Path) -> None:
    server = serve({"conversations": [{"name": "other", "match": {"user": "checkout"}, "turns": [{"content": "x"}]}]})
    with pytest.raises(ModelPermanentError, match="no conversation in the script matches") as caught:
        engine_for(server.base_url).propose(request_for(cart_repo))
    assert caught.value.status == 400


def test_token_budget_stops_the_attempt_after_the_response_that_crossed_it(serve: Serve, cart_repo: Path) -> None:
    server = serve(FIX)
    with pytest.raises(RepairBudgetError, match="the budget is 50") as caught:
        engine_for(server.base_url).propose(request_for(cart_repo, token_budget=50))
    usage = recorded(server)
    assert len(usage) == 1
    assert caught.value.prompt_tokens + caught.value.completion_tokens > 50
    assert caught.value.prompt_tokens > 0


def test_max_turns_stops_a_model_that_does_not_finish(serve: Serve, cart_repo: Path) -> None:
    server = serve(FIX)
    with pytest.raises(RepairBudgetError, match="all 2 turns"):
        engine_for(server.base_url).propose(request_for(cart_repo, max_turns=2))
    assert len(recorded(server)) == 2


def test_finishing_without_edits_is_no_patch(serve: Serve, cart_repo: Path) -> None:
    script: dict[str, Any] = {
        "conversations": [
            {
                "name": "looks-only",
                "turns": [tool_turn("read_file", path="cart.py"), tool_turn("finish", summary="looks fine to me")],
            }
        ]
    }
    server = serve(script)
    with pytest.raises(NoPatchError, match="looks fine to me") as caught:
        engine_for(server.base_url).propose(request_for(cart_repo))
    assert caught.value.prompt_tokens > 0


def test_failure_mid_conversation_carries_the_tokens_already_spent(serve: Serve, cart_repo: Path) -> None:
    server = serve(FIX)

    def fail_next_request(turn: int) -> None:
        if turn == 2:
            inject_fault(server, status=503)

    with pytest.raises(ModelTransientError) as caught:
        engine_for(server.base_url, on_turn=fail_next_request).propose(request_for(cart_repo))
    answered = [r for r in recorded(server) if r["status"] == 200]
    assert len(answered) == 2
    assert caught.value.status == 503
    assert caught.value.prompt_tokens > 0 and caught.value.completion_tokens > 0
