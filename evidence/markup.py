"""Escaping for the report: every piece of text taken from a bundle, a log or a page goes through ``esc``."""

from __future__ import annotations

import html


def esc(text: str) -> str:
    """``text`` HTML-escaped (quotes included, so it is safe in attributes too) and encodable as UTF-8.

    A page's text can hold lone surrogates (JavaScript strings may); they are shown as ``\\udXXX`` escapes
    instead of making the report impossible to write.
    """
    printable = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return html.escape(printable, quote=True)


def code(text: str, cls: str = "") -> str:
    """``text`` escaped in a ``<code>`` element (with ``cls`` as its class when given)."""
    attribute = f' class="{esc(cls)}"' if cls else ""
    return f"<code{attribute}>{esc(text)}</code>"
