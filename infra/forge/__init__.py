"""A local GitHub: REST API 2022-11-28, git over smart HTTP, signed webhooks and fault injection.

Start one with :class:`ForgeServer` (or ``python -m infra.forge serve``); tests use
:func:`infra.forge.testing.running_forge` or the ``forge`` fixture of :mod:`infra.forge.pytest_plugin`.
"""

from .server import ForgeServer

__all__ = ["ForgeServer"]
