"""The phases of ``repair_bug`` as plain classes, each given one :class:`~pipeline.flow.context.RunContext`.

:mod:`pipeline.workflow` holds the Temporal handlers, ``run`` and the wiring; the work of each phase lives
here, one module per phase: :mod:`.intake` (report, ticket, procedure, spec, baseline), :mod:`.environments`
(provision, reproduce, teardown, hosts), :mod:`.repair` and :mod:`.agent` (the engines), :mod:`.verify`,
:mod:`.publish`, :mod:`.review` (the review gate and the merge), :mod:`.moved` (moved heads and bases),
:mod:`.revise` (revisions on review) and :mod:`.ending`. :mod:`.decisions` holds what the handlers decide
(approval, rejection, requests for changes, moved heads) and :mod:`.candidates` the kinds of candidate.

Everything here runs inside the workflow sandbox and must stay deterministic: no I/O, clocks or randomness
other than ``workflow.now()``; a module imported here that is not deterministic-safe is imported through
``workflow.unsafe.imports_passed_through()``, as :mod:`pipeline.workflow` does. Every patch asked
(:meth:`~pipeline.flow.context.RunContext.patched`) sits exactly where it sat before the split, so recorded
histories replay unchanged. :mod:`.phases` wires the phases together on one run context.
"""
