"""The forge adapter: tickets, branches, draft PRs, keyed comments, reviews and merges on GitHub.

Deliberately empty of imports: the workflow imports ``reviews.markers`` (pure string functions) and must
not pull PyGithub in with it. Import what you need from its module: ``reviews.adapter.GitHubForge``,
``reviews.config.ForgeConfig``, ``reviews.errors``, ``reviews.models``.
"""
