"""Fixtures of this folder, from :mod:`tests.support.docker`."""

from tests.support.docker import (
    cart_recipe,
    cart_spec,
    cart_workspace,
    docker_client,
    docker_engine,
    image_cache,
    new_run,
    provider,
    provider_state,
)

__all__ = [
    "cart_recipe",
    "cart_spec",
    "cart_workspace",
    "docker_client",
    "docker_engine",
    "image_cache",
    "new_run",
    "provider",
    "provider_state",
]
