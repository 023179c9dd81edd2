"""Fixtures for the forge's tests: a running forge, users with tokens, PyGithub clients, a webhook receiver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra.forge.pytest_plugin import forge
from infra.forge.testing import ForgeHandle
from tests.support.forge import Receiver, Team, running_receiver

__all__ = ["forge"]


@pytest.fixture
def team(forge: ForgeHandle) -> Team:
    alice = forge.create_user("alice")
    bob = forge.create_user("bob")
    carol = forge.create_user("carol")
    forge.create_repo(alice, "shop")
    forge.add_collaborator(alice, "alice/shop", "bob", "push")
    return Team(forge, alice, bob, carol)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as rec:
        yield rec
