"""Fixtures of this folder, from :mod:`tests.support.review_site`."""

from tests.support.review_site import forge, site

__all__ = ["forge", "site"]
