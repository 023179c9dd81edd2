"""The reviewer's report: one static, self-contained HTML page per evidence bundle.

The page leads with what proves the fix: for every check of the reproduction procedure, what it expects,
what the page showed on the base revision and on the candidate commit (read from each revision's stored
reproduction log), whether the check held, and a crop of the element the check read beside a link to the
whole page. Then each revision's verdict against what was expected, the screenshots of both revisions side by
side (each opens full size on click), the procedure as the reporter wrote it, the patch, the test results,
links to the Playwright traces, videos and logs, and every artifact's sha256 with the bundle digest an
approval names.

A command or test reproduction (a stored procedure with a ``kind``) has its own proof, output and procedure
sections instead of the browser's (:mod:`evidence.sandbox_view`): each check or test on both revisions, and
every command's exit status, stdout and stderr side by side with what a check read marked.

Self-contained: images are embedded as ``data:`` URIs (each distinct image once per revision), styles are
inline, and the full-size view is CSS only (``:target``), so the single file can be stored as a ``report``
artifact and opened from any store URL (a presigned S3 URL included). Everything taken from artifacts
(steps, observed values, patch, logs, names) is HTML-escaped, and a Content-Security-Policy allowing no
script, no fetches and only ``data:`` images keeps a hostile page, patch or log from running in a reviewer's
browser. Traces, logs and the original images are linked through ``store.url_for`` (on S3 those links
expire with the presigned URL; regenerate the report to renew them). The page is a function of the bundle
and the store's URLs: rendering it again gives the same bytes.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evidence import sandbox_view
from evidence.blocked_requests import BlockedRequests, read_blocked_requests
from evidence.bundle import CheckResult, EvidenceBundle, RegressionEvidence, RevisionEvidence, bundle_digest
from evidence.interface import ArtifactRef, ArtifactStore
from evidence.markup import code, esc
from evidence.observations import CheckObservation, Observations, moment_of, read_observations, screenshot_named
from evidence.procedure_view import as_yaml, check_parts, load_procedure, step_html
from evidence.report_parts import (
    SIDE_LABEL,
    check_row,
    checks_table,
    link,
    observed_value,
    runs_note,
    verdict_class,
    verdict_table,
)
from evidence.sandbox_runs import SandboxRuns, StoredProcedure, procedure_kind, read_sandbox_runs

REPORT_NAME = "index.html"
# Larger artifacts are linked instead of inlined, so a report stays small enough to open quickly.
_INLINE_IMAGE_MAX = 4 * 1024 * 1024
_INLINE_TEXT_MAX = 2 * 1024 * 1024
_TEST_OUTPUT_TAIL_LINES = 200

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

# Colour emoji come from the emoji font (Debian fonts-noto-color-emoji) named after each generic family.
_STYLE = """
body{font:15px/1.45 system-ui,sans-serif,"Noto Color Emoji";margin:0 auto;max-width:1200px;padding:1rem 1.5rem;
color:#1f2328}
h1{font-size:1.5rem;margin:.2rem 0}h2{border-bottom:1px solid #d0d7de;padding-bottom:.2rem;margin-top:2rem}
code,pre{font:13px/1.4 ui-monospace,monospace,"Noto Color Emoji"}pre{background:#f6f8fa;padding:.75rem;overflow:auto}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #d0d7de;padding:.3rem .5rem;text-align:left;
vertical-align:top}th{background:#f6f8fa}.sha{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
.verdict{display:inline-block;padding:.1rem .55rem;border-radius:1rem;font-weight:600}
.pass{background:#dafbe1;color:#116329}.fail{background:#ffebe9;color:#a40e26}.neutral{background:#eaeef2}
.compare{display:grid;grid-template-columns:7rem minmax(0,1fr) minmax(0,1fr);gap:.5rem 1rem}
.compare>.side{display:contents}.compare h3{margin:.3rem 0}
.compare .cell,.compare .moment{border-top:1px solid #d0d7de;padding-top:.4rem}.moment{font-weight:600}
figure{margin:.4rem 0}figcaption{font-size:12px;color:#59636e}img{max-width:100%;border:1px solid #d0d7de}
code.observed{background:#fff8c5;padding:0 .25rem;white-space:pre-wrap;word-break:break-word;font-size:15px}
.seen+.seen{border-top:1px dashed #d0d7de;margin-top:.4rem;padding-top:.4rem}
/* A crop keeps its own size (a block element's crop is a whole line wide): scroll it, never shrink it. */
.seen .open{display:block;overflow-x:auto}.seen .zoom:not(:target) img{max-width:none}
#proof table{table-layout:fixed}#proof tr:first-child th:nth-child(1){width:16%}
#proof tr:first-child th:nth-child(2){width:14%}
.zoom .open img{cursor:zoom-in}.zoom .close{display:none}
.zoom:target .close{display:block;position:fixed;inset:0;z-index:10;background:rgba(31,35,40,.85);cursor:zoom-out}
.zoom:target .open img{position:fixed;inset:0;margin:auto;z-index:11;width:auto;height:auto;max-width:98vw;
max-height:98vh;background:#fff;pointer-events:none}
.diff .add{background:#dafbe1}.diff .del{background:#ffebe9}.diff .hunk{color:#0550ae}.diff .meta{font-weight:600}
pre.wrap{white-space:pre-wrap;word-break:break-word}.note{color:#59636e;font-size:13px}code.action{color:#59636e}
"""


def render_report(bundle: EvidenceBundle, store: ArtifactStore, out_dir: Path) -> Path:
    """Write ``out_dir/index.html`` for ``bundle``, reading artifacts from ``store``; return its path.

    Every artifact it reads is verified against its sha256 (an :class:`IntegrityError` fails the render
    rather than showing a reviewer tampered evidence). A log or procedure that cannot be read is no error:
    the page says what it could not show.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = bundle_digest(bundle)
    verdict = "pass" if bundle.passed else "fail"
    title = f"{bundle.repository}#{bundle.issue_number}"
    procedure_text = store.read_bytes(bundle.procedure).decode("utf-8", errors="replace")
    stored = procedure_kind(procedure_text)
    style = _STYLE
    if stored.kind in sandbox_view.KIND_TEXT:
        reproduction = _sandbox_sections(bundle, store, stored, procedure_text)
        style += sandbox_view.STYLE
    else:
        reproduction = _browser_sections(bundle, store, procedure_text)
    body = "\n".join(
        [
            f"<header><h1>durafix evidence for {_e(title)}</h1>",
            f'<p><span class="verdict {verdict}" id="verdict">'
            f"{'all checks passed' if bundle.passed else 'not all checks passed'}</span></p></header>",
            "<main>",
            _summary(
                bundle,
                digest,
                sandbox_view.KIND_TEXT.get(stored.kind),
                drafted=bundle.procedure.name == sandbox_view.DRAFTED_PROCEDURE_NAME,
            ),
            *reproduction,
            _patch(bundle, store),
            _checks([*([bundle.baseline] if bundle.baseline else []), *bundle.checks], store),
            _regression(bundle.regression, store),
            _traces(bundle, store),
            _hashes(bundle, digest),
            "</main>",
        ]
    )
    page = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>durafix evidence: {_e(title)}</title>\n<style>{style}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )
    path = out_dir / REPORT_NAME
    path.write_text(page, encoding="utf-8")
    return path


def _browser_sections(bundle: EvidenceBundle, store: ArtifactStore, procedure_text: str) -> list[str]:
    """A browser procedure's proof, screenshots, blocked requests and steps."""
    procedure = load_procedure(procedure_text)
    images = _Images(store)
    observed: dict[str, Observations] = {s.role: read_observations(s, store) for s in (bundle.base, bundle.candidate)}
    return [
        _proof(bundle, procedure, observed, images),
        _comparison(bundle, observed, images),
        _blocked_requests(bundle, store),
        _procedure(bundle, store, procedure, procedure_text),
    ]


def _sandbox_sections(
    bundle: EvidenceBundle, store: ArtifactStore, stored: StoredProcedure, procedure_text: str
) -> list[str]:
    """A command or test reproduction's proof, each command's output on both revisions, and the procedure."""
    runs: dict[str, SandboxRuns] = {s.role: read_sandbox_runs(s, store) for s in (bundle.base, bundle.candidate)}
    view = stored.view
    return [
        sandbox_view.proof(bundle, stored.kind, view, runs),
        sandbox_view.comparison(bundle, stored.kind, view, runs, store),
        sandbox_view.procedure(bundle, store, stored.kind, view, stored.problem, procedure_text, runs),
    ]


@dataclass
class _Images:
    """Embeds each distinct image once per revision; a later use of the same pixels links to the first.

    A figure's id is a function of its revision and sha256, so a link to a screenshot can be written before
    (or without) the figure that shows it: the proof table links to full-page screenshots the screenshots
    section embeds. Opening that id shows the image full size (CSS ``:target``); the figure's close link goes
    back to the thumbnail.
    """

    store: ArtifactStore
    embedded: dict[tuple[str, str], str] = field(default_factory=dict)
    shown: set[str] = field(default_factory=set)

    @staticmethod
    def anchor(role: str, ref: ArtifactRef) -> str:
        return f"shot-{role}-{ref.sha256[:16]}"

    def figure(self, role: str, ref: ArtifactRef, label: str, alt: str, extra: str = "") -> str:
        """``ref`` as a figure captioned ``label`` (with a link to the stored file and ``extra``, HTML), or,
        when its pixels are already on the page for ``role``, a link to where they are."""
        self.shown.add(ref.key)
        anchor = self.anchor(role, ref)
        first = self.embedded.get((role, ref.sha256))
        original = f'<a href="{_e(self.store.url_for(ref))}" title="{_e(ref.name)}">file</a>'
        caption = f'<figcaption>{_e(label)} · {original} <span class="sha">{ref.sha256[:16]}</span>{extra}</figcaption>'
        if first is not None:
            same = f'<p class="note">same image as <a href="#{anchor}">{_e(first)}</a></p>'
            return f"<figure>{same}{caption}</figure>"
        self.embedded[(role, ref.sha256)] = label
        if not ref.media_type.startswith("image/") or ref.size > _INLINE_IMAGE_MAX:
            return f'<figure id="{anchor}"><p class="note">too large to embed; follow the link.</p>{caption}</figure>'
        data = base64.b64encode(self.store.read_bytes(ref)).decode("ascii")
        return (
            f'<figure class="zoom" id="{anchor}">'
            f'<a class="open" id="{anchor}-thumb" href="#{anchor}" title="show full size">'
            f'<img src="data:{_e(ref.media_type)};base64,{data}" alt="{_e(alt)}"></a>'
            f'<a class="close" href="#{anchor}-thumb" aria-label="close the full-size image"></a>'
            f"{caption}</figure>"
        )


def _summary(bundle: EvidenceBundle, digest: str, reproduced_with: str | None = None, *, drafted: bool = False) -> str:
    """The run at a glance; ``reproduced_with`` names a reproduction that is not a browser procedure's, and
    ``drafted`` says the model drafted it (a browser procedure's page stays as it was before other kinds)."""
    kind = []
    if reproduced_with:
        said = f'<span id="reproduction-kind">{_e(reproduced_with)}</span>'
        if drafted:
            said += f', <span id="reproduction-drafted">{_e(sandbox_view.DRAFTED_TEXT)}</span>'
        kind = [("reproduced with", said)]
    rows = [
        *kind,
        ("repository", _e(bundle.repository)),
        ("issue", f"#{bundle.issue_number}"),
        ("run", f"<code>{_e(bundle.run_id)}</code>"),
        ("base revision", f'<code class="sha">{_e(bundle.base_revision)}</code>'),
        ("candidate commit", f'<code class="sha">{_e(bundle.candidate_commit)}</code>'),
        ("evidence bundle digest", f'<code class="sha" id="bundle-digest">{digest}</code>'),
    ]
    approve = f"durafix approve {bundle.run_id} --sha {bundle.candidate_commit} --evidence {digest}"
    return (
        '<section id="summary"><h2>Summary</h2><table>'
        + "".join(f'<tr><th scope="row">{k}</th><td>{v}</td></tr>' for k, v in rows)
        + "</table>"
        + '<p class="note">An approval names the candidate commit and this digest (the sha256 of the stored '
        "evidence manifest); the merge refuses any other head.</p>" + f"<pre>{_e(approve)}</pre></section>"
    )


def _proof(
    bundle: EvidenceBundle, procedure: dict[str, Any] | None, observed: dict[str, Observations], images: _Images
) -> str:
    checks: list[Any] = []
    if procedure is not None and isinstance(procedure.get("bug_present"), list):
        checks = procedure["bug_present"]
    indices = sorted({*range(len(checks)), *(i for o in observed.values() for i in o.checks)})
    head = (
        '<section id="proof"><h2>What proves the fix</h2>'
        "<p>The bug is present when <strong>every</strong> check below holds, so a check that holds is a sign "
        "of the bug. On the base revision every check must hold; on the candidate commit at least one must "
        "not. Each cell shows the value the page showed, whether the check held, the element the check read, "
        "and a link to the whole page at that moment (click an image to see it full size).</p>"
    )
    if not indices:
        return f'{head}<p class="note">the procedure names no checks and no log recorded any.</p></section>'
    sides = (bundle.base, bundle.candidate)
    rows = []
    for index in indices:
        if index < len(checks):
            subject, condition = check_parts(checks[index])
        else:
            described = next((o.descriptions[index] for o in observed.values() if index in o.descriptions), "")
            subject, condition = code(described or f"check {index + 1}"), ""
        cells = "".join(_observed_cell(s, observed[s.role], index, images) for s in sides)
        rows.append(check_row(index, subject, condition, cells))
    return checks_table(head, sides, rows)


def _observed_cell(side: RevisionEvidence, observations: Observations, index: int, images: _Images) -> str:
    attributes = f'class="observed-cell" data-role="{side.role}" data-check="{index + 1}"'
    if observations.log is None:
        return f'<td {attributes}><p class="note">not recorded: {_e(observations.note or "no log")}</p></td>'
    seen = observations.for_check(index)
    if not seen:
        return f'<td {attributes}><p class="note">the log records no run</p></td>'
    several_runs = len(observations.runs) > 1
    # Runs that saw the same are one entry (in the order first seen), so a flaky value stands out.
    groups: dict[tuple[bool | None, str | None, str | None, bool], list[CheckObservation]] = {}
    for seen_once in seen:
        key = (seen_once.holds, seen_once.actual, seen_once.error, seen_once.run_bug_present)
        groups.setdefault(key, []).append(seen_once)
    parts = "".join(_observation(side, runs, index, images, several_runs) for runs in groups.values())
    return f"<td {attributes}>{parts}</td>"


def _observation(
    side: RevisionEvidence, runs: list[CheckObservation], index: int, images: _Images, several_runs: bool
) -> str:
    first = runs[0]
    cls = verdict_class(side.role, first.holds, first.run_bug_present)
    verdict = {True: "holds", False: "does not hold", None: "not evaluated"}[first.holds]
    which = runs_note([o.run for o in runs], several_runs)
    value = observed_value(first.actual, "the log")
    error = f'<p class="note">{_e(first.error)}</p>' if first.error else ""
    where = f"{SIDE_LABEL[side.role].lower()}, run {first.run}, check {index + 1}"
    crop = screenshot_named(side.screenshots, first.element_screenshot)
    page = screenshot_named(side.screenshots, first.screenshot)
    link = f'<a class="page" href="#{images.anchor(side.role, page)}">the whole page</a>' if page else ""
    if crop is not None:
        label, alt = f"run {first.run}: the element", f"{where}: the element it read"
        shown = images.figure(side.role, crop, label, alt, f" · {link}" if link else "")
    else:
        # Checks on no element (the URL, a response) have only the page.
        shown = f'<p class="note">{link}</p>' if link else ""
    return f'<div class="seen">{value} <span class="verdict {cls}">{verdict}</span>{which}{error}{shown}</div>'


def _comparison(bundle: EvidenceBundle, observed: dict[str, Observations], images: _Images) -> str:
    """Each revision's verdict against what was expected, then both revisions' screenshots side by side, one
    row per moment of the procedure (``run 1: check 1``), except the element crops the proof already shows.

    One grid: a column per revision, each revision's cells inside its own ``#side-<role>`` element (carrying
    ``data-revision``) laid out with ``display: contents``, so a moment's screenshots share a row.
    """
    sides = (bundle.base, bundle.candidate)
    moments: dict[str, tuple[str, dict[str, list[ArtifactRef]]]] = {}
    for side in sides:
        for ref in side.screenshots:
            if ref.key not in images.shown:
                moment = moment_of(ref.name)
                moments.setdefault(moment.key, (moment.label, {}))[1].setdefault(side.role, []).append(ref)
    labels = "".join(
        f'<div class="moment" style="grid-area:{row}/1">{_e(label)}</div>'
        for row, (label, _) in enumerate(moments.values(), start=3)
    )
    columns = []
    for column, side in enumerate(sides, start=2):
        cells = [
            f'<h3 style="grid-area:1/{column}">{SIDE_LABEL[side.role]} {code(side.revision[:12], "sha")}</h3>',
            f'<div class="cell" style="grid-area:2/{column}">{verdict_table(side, observed[side.role].note)}</div>',
        ]
        for row, (key, (label, by_role)) in enumerate(moments.items(), start=3):
            alt = f"{SIDE_LABEL[side.role].lower()}, {label}: the page"
            figures = "".join(images.figure(side.role, ref, label, alt) for ref in by_role.get(side.role, []))
            cells.append(
                f'<div class="cell shot" data-moment="{_e(key)}" style="grid-area:{row}/{column}">'
                f"{figures or '<span class=note>no screenshot</span>'}</div>"
            )
        article = f'<article class="side" id="side-{side.role}" data-revision="{_e(side.revision)}">'
        columns.append(f"{article}{''.join(cells)}</article>")
    hint = '<p class="note">Click a screenshot to see it full size, and anywhere to close it.</p>' if moments else ""
    return (
        f'<section id="reproduction"><h2>Observed vs expected</h2>{hint}'
        f'<div class="compare">{labels}{"".join(columns)}</div></section>'
    )


def _blocked_requests(bundle: EvidenceBundle, store: ArtifactStore) -> str:
    """The requests the pages made to origins they may not reach (aborted in the browser), per revision;
    nothing at all when no request was blocked. Every URL is the page's choice, so escaped and never a link."""
    sides = [(side, read_blocked_requests(side, store)) for side in (bundle.base, bundle.candidate)]
    if not any(blocked.total for _, blocked in sides):
        return ""
    parts = [
        '<section id="blocked-requests"><h2>Blocked requests</h2>'
        "<p>The app's pages asked for these addresses outside the origins they may reach (the app's own and "
        "the recipe's <code>browser_origins</code>); the browser aborted each before it left, so none reached "
        "its server.</p>"
    ]
    for side, blocked in sides:
        parts.append(_blocked_table(side, blocked))
    return "".join(parts) + "</section>"


def _blocked_table(side: RevisionEvidence, blocked: BlockedRequests) -> str:
    label = f"{SIDE_LABEL[side.role]} {code(side.revision[:12], 'sha')}"
    allowed = ", ".join(code(o) for o in blocked.allowed_origins) or '<span class="note">not recorded</span>'
    head = f'<h3>{label}</h3><p class="note">allowed origins: {allowed}</p>'
    if not blocked.total:
        return f'{head}<p class="note">none blocked</p>'
    rows = "".join(
        f"<tr><td>{r.run}</td><td>{_e(r.method)}</td><td><code>{_e(r.url)}</code></td><td>{_e(r.resource_type)}</td></tr>"
        for r in blocked.requests
    )
    more = f'<p class="note">and {blocked.dropped} more, not listed</p>' if blocked.dropped else ""
    return (
        f'{head}<table class="blocked" data-role="{side.role}"><tr><th>run</th><th>method</th><th>URL</th>'
        f"<th>type</th></tr>{rows}</table>{more}"
    )


def _procedure(bundle: EvidenceBundle, store: ArtifactStore, procedure: dict[str, Any] | None, text: str) -> str:
    head = f'<section id="steps"><h2>Reproduction procedure</h2><p>{link(bundle.procedure, store)}</p>'
    if procedure is None:
        return f"{head}<pre>{_e(text)}</pre></section>"
    name = f"<p><strong>{_e(str(procedure['name']))}</strong></p>" if procedure.get("name") else ""
    steps = "".join(f"<li>{step_html(step)}</li>" for step in procedure["steps"])
    checks = procedure.get("bug_present")
    present = ""
    if isinstance(checks, list) and checks:
        present = "<h3>The bug is present when all of these hold</h3><ol>" + "".join(
            f"<li>{step_html(c)}</li>" for c in checks
        )
        present += "</ol>"
    runs = procedure.get("runs")
    repeat = ""
    if runs:
        repeat = (
            f'<p class="note">Run {_e(str(runs))} times, each in a fresh browser context; '
            "runs that disagree are inconclusive.</p>"
        )
    source = f"<details><summary>as YAML</summary><pre>{_e(as_yaml(procedure))}</pre></details>"
    return f"{head}{name}<h3>Steps</h3><ol>{steps}</ol>{present}{repeat}{source}</section>"


def _patch(bundle: EvidenceBundle, store: ArtifactStore) -> str:
    head = f'<section id="patch"><h2>Patch</h2><p>{link(bundle.patch, store)}</p>'
    if bundle.patch.size > _INLINE_TEXT_MAX:
        return f'{head}<p class="note">too large to show inline; follow the link.</p></section>'
    text = store.read_bytes(bundle.patch).decode("utf-8", errors="replace")
    lines = []
    for line in text.splitlines():
        if line.startswith(("+++", "---", "diff ", "index ")):
            cls = "meta"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = ""
        lines.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line))
    return f'{head}<pre class="diff">' + "\n".join(lines) + "</pre></section>"


def _checks(checks: list[CheckResult], store: ArtifactStore) -> str:
    if not checks:
        return '<section id="checks"><h2>Test results</h2><p class="note">no checks were run</p></section>'
    rows = []
    tails = []
    for check in checks:
        result = "passed" if check.passed else "failed"
        verdict = f'<span class="verdict {"pass" if check.passed else "fail"}">{result}</span>'
        output = link(check.output, store) if check.output else ""
        rows.append(f"<tr><td>{_e(check.name)}</td><td>{verdict}</td><td>{_e(check.detail)}</td><td>{output}</td></tr>")
        if check.output is not None and check.output.size <= _INLINE_TEXT_MAX:
            text = store.read_bytes(check.output).decode("utf-8", errors="replace")
            tail = "\n".join(text.splitlines()[-_TEST_OUTPUT_TAIL_LINES:])
            tails.append(
                f"<details><summary>{_e(check.name)}: output (last lines)</summary><pre>{_e(tail)}</pre></details>"
            )
    return (
        '<section id="checks"><h2>Test results</h2><table><tr><th>check</th><th>result</th><th>detail</th>'
        "<th>output</th></tr>" + "".join(rows) + "</table>" + "".join(tails) + "</section>"
    )


def _regression(proof: RegressionEvidence | None, store: ArtifactStore) -> str:
    """The patch's tests without the fix and with it: the proof that they catch the bug."""
    head = '<section id="regression"><h2>Regression proof</h2>'
    if proof is None:
        return f'{head}<p class="note">no regression proof was run for this candidate</p></section>'
    proven = proof.status == "proven"
    verdict = f'<span class="verdict {"pass" if proven else "fail"}">{_e(proof.status)}</span>'
    if not proof.test_files:
        return f"{head}<p>{verdict} {_e(proof.summary)}</p></section>"
    base_said = (
        "failed, as a test of the bug should"
        if proven
        else ("passed" if proof.status == "not-proven" else "did not run")
    )
    base_log = link(proof.base_output, store) if proof.base_output else ""
    candidate_log = link(proof.candidate_output, store) if proof.candidate_output else "the candidate's test run"
    files = "".join(f"<li><code>{_e(name)}</code></li>" for name in proof.test_files)
    cases = "".join(f"<li><code>{_e(name)}</code></li>" for name in proof.fixed_cases)
    return (
        f"{head}<p>{verdict} {_e(proof.summary)}</p><p>the patch's test files:</p><ul>{files}</ul>"
        "<table><tr><th>run</th><th>code</th><th>tests</th><th>output</th></tr>"
        f'<tr class="regression-base"><td>base + the patch\'s tests</td><td>without the fix</td>'
        f'<td><span class="verdict {"pass" if proven else "fail"}">{base_said}</span></td><td>{base_log}</td></tr>'
        '<tr class="regression-candidate"><td>candidate</td><td>with the fix</td>'
        f'<td><span class="verdict pass">passed</span></td><td>{candidate_log}</td></tr></table>'
        + (f"<p>test cases that fail without the fix and pass with it:</p><ul>{cases}</ul>" if cases else "")
        + "</section>"
    )


def _traces(bundle: EvidenceBundle, store: ArtifactStore) -> str:
    items = []
    for side in (bundle.base, bundle.candidate):
        for ref in [*side.traces, *side.videos, *side.logs]:
            items.append(f"<li>{side.role} <code>{_e(side.revision[:12])}</code>: {link(ref, store)}</li>")
    listing = "".join(items) or "<li>none recorded</li>"
    # Only a browser run records traces; a command or test reproduction's page has logs and records only.
    hint = (
        '<p class="note">Download a trace and open it with <code>playwright show-trace FILE</code> '
        "to step through the run's actions, DOM snapshots, console and network.</p>"
        if any(side.traces for side in (bundle.base, bundle.candidate))
        else ""
    )
    return f'<section id="traces"><h2>Traces, videos and logs</h2><ul>{listing}</ul>{hint}</section>'


def _hashes(bundle: EvidenceBundle, digest: str) -> str:
    rows = "".join(
        f"<tr><td>{_e(ref.name)}</td><td>{ref.kind.value}</td><td><code>{_e((ref.revision or '')[:12])}</code></td>"
        f'<td>{ref.size}</td><td class="sha">{ref.sha256}</td></tr>'
        for ref in bundle.artifacts()
    )
    return (
        '<section id="artifacts"><h2>Artifacts</h2><table><tr><th>name</th><th>kind</th><th>revision</th>'
        f"<th>bytes</th><th>sha256</th></tr>{rows}</table>"
        f'<p class="note">Bundle digest <span class="sha">{digest}</span> covers all of the above.</p></section>'
    )


def _e(text: str) -> str:
    return esc(text)
