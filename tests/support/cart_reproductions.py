"""The sample cart's bug as a command reproduction against its running app (``app: true``): its API's total,
read from ``$DURAFIX_APP_URL``, is not the one that counts quantities (4000 cents; the buggy cart says 2375)."""

from __future__ import annotations

CART_API_TOTAL = """version: 1
kind: command
name: the cart API's total ignores quantities
app: true
files:
  repro/total.py: |
    import json, os, urllib.request
    with urllib.request.urlopen(os.environ["DURAFIX_APP_URL"] + "/api/cart", timeout=10) as answer:
        print(json.load(answer)["total_cents"])
steps:
  - run: python3 repro/total.py
    timeout_s: 30
bug_present:
  - {check: stdout, not_equals: "4000"}
"""


def reported(procedure: str, intro: str = "") -> str:
    """``procedure`` as a report's ``durafix-repro`` block, after ``intro``."""
    return f"{intro}\n```durafix-repro\n{procedure}```\n"
