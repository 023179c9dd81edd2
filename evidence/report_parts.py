"""Pieces of the reviewer's report that every kind of reproduction shows alike: the revisions' labels and column
heads, the table of the checks that prove the fix, a verdict against what was expected, and a link to a stored
artifact."""

from __future__ import annotations

from collections.abc import Sequence

from evidence.bundle import RevisionEvidence
from evidence.interface import ArtifactRef, ArtifactStore
from evidence.markup import code, esc

SIDE_LABEL: dict[str, str] = {"base": "Base revision", "candidate": "Candidate commit"}

# A check's value can be a whole page's text, output or file: the log or record keeps all of it, the table the start.
OBSERVED_MAX_CHARS = 1_000


def side_expectation(role: str) -> str:
    if role == "base":
        return "every check holds (the bug is present)"
    return "some check does not hold (the bug is gone)"


def column_heads(sides: Sequence[RevisionEvidence], expectation: bool = True) -> str:
    """A column head (HTML) for each of ``sides``: its label and revision and, with ``expectation``, what is
    expected of the checks on it."""
    heads = []
    for side in sides:
        expected = f'<br><span class="note">expected: {side_expectation(side.role)}</span>' if expectation else ""
        heads.append(f'<th scope="col">{SIDE_LABEL[side.role]} {code(side.revision[:12], "sha")}{expected}</th>')
    return "".join(heads)


def check_row(index: int, subject: str, condition: str, cells: str) -> str:
    """The row of the ``index``-th (from 0) check in :func:`checks_table`: ``subject`` (what the check reads) and
    ``condition`` (what it expects there; empty when the procedure does not state it), both HTML, then
    ``cells``: a ``<td>`` per side, in the table's column order."""
    return (
        f'<tr id="check-{index + 1}"><th scope="row">{index + 1}. {subject}</th>'
        f"<td>{condition or '<span class=note>(not stated)</span>'}</td>{cells}</tr>"
    )


def checks_table(head: str, sides: Sequence[RevisionEvidence], rows: Sequence[str]) -> str:
    """The proof section: ``head`` (the section's opening and what the checks mean, HTML), then the table of the
    checks' ``rows`` (:func:`check_row`) with a column per side of ``sides``, then the section's end."""
    return (
        f'{head}<table><tr><th scope="col">check: what it reads</th><th scope="col">expected there</th>'
        f"{column_heads(sides)}</tr>{''.join(rows)}</table></section>"
    )


def status_text(status: str) -> str:
    return {
        "reproduced": "reproduced: every check held, the bug is present",
        "not_reproduced": "not reproduced: some check did not hold, the bug is absent",
        "inconclusive": "inconclusive: runs disagreed or could not be completed",
        "infra_failure": "infrastructure failure: no verdict",
    }.get(status, status)


def verdict_table(side: RevisionEvidence, note: str | None) -> str:
    """``side``'s status against what was expected, the runner's detail, and ``note`` (what could not be read)."""
    outcome = "as expected" if side.as_expected else "NOT as expected"
    detail = f'<pre class="wrap">{esc(side.detail)}</pre>' if side.detail else ""
    shown = f'<p class="note">{esc(note)}</p>' if note else ""
    return (
        f'<table><tr><th scope="row">expected</th><td>{esc(status_text(side.expected_status))}</td></tr>'
        f'<tr><th scope="row">observed</th><td>{esc(status_text(side.status))} '
        f'<span class="verdict {"pass" if side.as_expected else "fail"}">{outcome}</span></td></tr></table>'
        f"{detail}{shown}"
    )


def link(ref: ArtifactRef, store: ArtifactStore) -> str:
    return f'<a href="{esc(store.url_for(ref))}">{esc(ref.name)}</a> <span class="sha">sha256 {ref.sha256}</span>'


def observed_value(actual: str | None, kept_in: str) -> str:
    """What a check read, escaped: a note for no value or an empty one, and past :data:`OBSERVED_MAX_CHARS` the
    start of it with how many more characters ``kept_in`` (e.g. "the log") holds."""
    if actual is None:
        return '<span class="note">no value</span>'
    if actual == "":
        return '<code class="observed"></code> <span class="note">(empty)</span>'
    if len(actual) > OBSERVED_MAX_CHARS:
        rest = len(actual) - OBSERVED_MAX_CHARS
        more = f'<span class="note">… {rest} more characters in {esc(kept_in)}</span>'
        return f"{code(actual[:OBSERVED_MAX_CHARS], 'observed')}{more}"
    return code(actual, "observed")


def verdict_class(role: str, holds: bool | None, run_bug_present: bool) -> str:
    """The colour of one check's verdict on the ``role`` side: ``pass`` where it is what a fixed bug asks for
    (it holds on the base, it does not hold on the candidate), ``fail`` where it is not or could not be read,
    and ``neutral`` for a check that holds on the candidate in a run whose other checks showed the bug gone."""
    if holds is None:
        return "fail"
    if holds:
        return "pass" if role == "base" else ("fail" if run_bug_present else "neutral")
    return "fail" if role == "base" else "pass"


def runs_note(runs: list[int], several: bool) -> str:
    """Which runs saw a value, as a note after it; nothing when the reproduction ran only once (``several``
    False)."""
    if not several:
        return ""
    numbers = ", ".join(str(run) for run in runs)
    return f' <span class="note">{"runs" if len(runs) > 1 else "run"} {numbers}</span>'
