"""The Temporal adapters: one module per task queue, each a class given the collaborators it uses.

The capability packages are libraries that know nothing of Temporal; these classes wrap them as activities
registered under the names declared in :mod:`pipeline.steps`, heartbeat long work, and turn capability
exceptions into failure classes through one table (:mod:`pipeline.activities.classify`). The worker builds
them from config for the queues it serves (:mod:`pipeline.services`).
"""
