"""Evaluating the ``expect_*`` shapes against a live page.

``evaluate`` looks once (an assertion in ``bug_present`` judges the state the steps left the page in);
``wait_until_holds`` polls until the check holds or its timeout passes (an ``expect_*`` step is a checkpoint
the page must reach). Both wait up to the shape's ``timeout_ms`` for the element to exist. Playwright errors
other than that wait timing out propagate: the caller decides whether the browser or the app is at fault.

The procedure's patterns come from an untrusted report and the text from an untrusted page, so a pattern is
searched with RE2 (linear time, :mod:`browser.patterns`) and only the first
:data:`~browser.patterns.MAX_TEXT_CHARS` characters of an element's text (cut in the page, before they
cross to this process) or of a URL are read. A text that was cut says so in the verdict's ``actual``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from playwright.async_api import Page
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from browser.patterns import MAX_TEXT_CHARS, search
from browser.procedure import Expectation, ExpectText, ExpectUrl, ExpectVisible
from browser.recorder import RunRecorder

POLL_INTERVAL_S = 0.1
# The element's rendered text, as Playwright's ``inner_text`` reads it, cut in the page: [length, prefix].
_CAPPED_INNER_TEXT = """(element, limit) => {
  if (!(element instanceof HTMLElement)) throw new Error("Node is not an HTMLElement");
  const text = element.innerText;
  return [text.length, text.slice(0, limit)];
}"""


@dataclass(frozen=True)
class Verdict:
    """``holds`` is None when the check could not be evaluated (``error`` says why)."""

    holds: bool | None
    actual: str | None
    error: str | None = None


def normalize_text(text: str) -> str:
    return " ".join(text.split())


async def evaluate(
    check: Expectation, page: Page, recorder: RunRecorder, element_timeout_ms: int | None = None
) -> Verdict:
    timeout_ms = check.timeout_ms if element_timeout_ms is None else max(1, element_timeout_ms)
    if isinstance(check, ExpectText):
        try:
            length, raw = await page.locator(check.selector).evaluate(
                _CAPPED_INNER_TEXT, MAX_TEXT_CHARS, timeout=timeout_ms
            )
        except PlaywrightTimeoutError:
            return Verdict(None, None, f"no element matches {check.selector!r} after {timeout_ms} ms")
        text = normalize_text(str(raw or ""))
        actual = text if int(length) <= MAX_TEXT_CHARS else f"{text} [cut at {MAX_TEXT_CHARS} of {length} characters]"
        return Verdict(_compare_text(check, text), actual)
    if isinstance(check, ExpectVisible):
        visible = await page.locator(check.selector).is_visible()
        return Verdict(visible, "visible" if visible else "not visible")
    if isinstance(check, ExpectUrl):
        url = urlsplit(page.url)
        relative = url.path + (f"?{url.query}" if url.query else "") + (f"#{url.fragment}" if url.fragment else "")
        relative = relative[:MAX_TEXT_CHARS]
        return Verdict(search(check.matches, relative), relative)
    status = recorder.latest_status(check.path)
    if status is None:
        return Verdict(None, None, f"the page received no response for {check.path}")
    return Verdict(status == check.status, str(status))


async def wait_until_holds(check: Expectation, page: Page, recorder: RunRecorder) -> Verdict:
    deadline = time.monotonic() + check.timeout_ms / 1000
    while True:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        verdict = await evaluate(check, page, recorder, element_timeout_ms=remaining_ms)
        if verdict.holds or remaining_ms <= 0:
            return verdict
        await asyncio.sleep(POLL_INTERVAL_S)


def _compare_text(check: ExpectText, text: str) -> bool:
    if check.equals is not None:
        return text == normalize_text(check.equals)
    if check.not_equals is not None:
        return text != normalize_text(check.not_equals)
    if check.contains is not None:
        return normalize_text(check.contains) in text
    assert check.matches is not None  # the schema guarantees exactly one comparison
    return search(check.matches, text)
