"""Docker environment provider: see :mod:`environments.docker.provider`."""

from environments.docker.provider import DockerProvider, UnsupportedRecipeError

__all__ = ["DockerProvider", "UnsupportedRecipeError"]
