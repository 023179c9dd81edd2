"""Repair: a model proposes a patch for a bug report in a scratch workspace (see ``docs/repair.md``).

Import what you need from the submodules; the workflow imports only :mod:`repair.interface`, which pulls in
no provider SDK.
"""
