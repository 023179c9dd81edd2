"""Fixtures of this folder, from :mod:`tests.support.evidence_stores`."""

from tests.support.evidence_stores import case, moto_s3, s3_case, s3_server

__all__ = ["case", "moto_s3", "s3_case", "s3_server"]
