"""The reviewer's report: one static, self-contained HTML page per evidence bundle.

The page shows, for the base revision and the candidate commit side by side, what the pipeline expected and
what it observed, with the screenshots; the reproduction steps; the patch; the check results; links to the
Playwright traces; and every artifact's sha256 with the bundle digest an approval names.

Self-contained: screenshots are embedded as ``data:`` URIs and styles are inline, so the single file can be
stored as a ``report`` artifact and opened from any store URL (a presigned S3 URL included). Everything
taken from artifacts (steps, patch, logs, names) is HTML-escaped, and a Content-Security-Policy allowing no
script, no fetches and only ``data:`` images keeps a hostile patch or log from running in a reviewer's
browser. Traces and logs are linked through ``store.url_for`` (on S3 those links expire with the presigned
URL; regenerate the report to renew them).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import yaml

from evidence.bundle import CheckResult, EvidenceBundle, RevisionEvidence, bundle_digest
from evidence.interface import ArtifactRef, ArtifactStore

REPORT_NAME = "index.html"
# Larger artifacts are linked instead of inlined, so a report stays small enough to open quickly.
_INLINE_IMAGE_MAX = 4 * 1024 * 1024
_INLINE_TEXT_MAX = 2 * 1024 * 1024
_TEST_OUTPUT_TAIL_LINES = 200

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:1rem 1.5rem;color:#1f2328}
h1{font-size:1.5rem;margin:.2rem 0}h2{border-bottom:1px solid #d0d7de;padding-bottom:.2rem;margin-top:2rem}
code,pre{font:13px/1.4 ui-monospace,monospace}pre{background:#f6f8fa;padding:.75rem;overflow:auto}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #d0d7de;padding:.3rem .5rem;text-align:left;
vertical-align:top}th{background:#f6f8fa}.sha{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
.verdict{display:inline-block;padding:.2rem .6rem;border-radius:1rem;font-weight:600}
.pass{background:#dafbe1;color:#116329}.fail{background:#ffebe9;color:#a40e26}
.sides{display:grid;grid-template-columns:1fr 1fr;gap:1rem}.side{border:1px solid #d0d7de;padding:.75rem}
.side img{max-width:100%;border:1px solid #d0d7de}figure{margin:.5rem 0}figcaption{font-size:12px;color:#59636e}
.diff .add{background:#dafbe1}.diff .del{background:#ffebe9}.diff .hunk{color:#0550ae}.diff .meta{font-weight:600}
.note{color:#59636e;font-size:13px}
"""


def render_report(bundle: EvidenceBundle, store: ArtifactStore, out_dir: Path) -> Path:
    """Write ``out_dir/index.html`` for ``bundle``, reading artifacts from ``store``; return its path.

    Every artifact it reads is verified against its sha256 (an :class:`IntegrityError` fails the render
    rather than showing a reviewer tampered evidence).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = bundle_digest(bundle)
    verdict = "pass" if bundle.passed else "fail"
    title = f"{bundle.repository}#{bundle.issue_number}"
    body = "\n".join(
        [
            f"<header><h1>durafix evidence for {_e(title)}</h1>",
            f'<p><span class="verdict {verdict}" id="verdict">'
            f"{'all checks passed' if bundle.passed else 'not all checks passed'}</span></p></header>",
            _summary(bundle, digest),
            _reproduction(bundle, store),
            _steps(bundle, store),
            _patch(bundle, store),
            _checks(bundle.checks, store),
            _traces(bundle, store),
            _hashes(bundle, digest),
        ]
    )
    page = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>durafix evidence: {_e(title)}</title>\n<style>{_STYLE}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )
    path = out_dir / REPORT_NAME
    path.write_text(page, encoding="utf-8")
    return path


def _summary(bundle: EvidenceBundle, digest: str) -> str:
    rows = [
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
        + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
        + "</table>"
        + '<p class="note">An approval names the candidate commit and this digest (the sha256 of the stored '
        "evidence manifest); the merge refuses any other head.</p>" + f"<pre>{_e(approve)}</pre></section>"
    )


def _reproduction(bundle: EvidenceBundle, store: ArtifactStore) -> str:
    return (
        '<section id="reproduction"><h2>Observed vs expected</h2><div class="sides">'
        + _side(bundle.base, "Base revision", store)
        + _side(bundle.candidate, "Candidate commit", store)
        + "</div></section>"
    )


def _side(side: RevisionEvidence, label: str, store: ArtifactStore) -> str:
    outcome = "as expected" if side.as_expected else "NOT as expected"
    figures = "".join(_figure(refs, store) for refs in _same_image(side.screenshots)) or (
        '<p class="note">no screenshots</p>'
    )
    detail = f"<pre>{_e(side.detail)}</pre>" if side.detail else ""
    return (
        f'<article class="side" id="side-{side.role}" data-revision="{_e(side.revision)}">'
        f'<h3>{label} <code class="sha">{_e(side.revision[:12])}</code></h3>'
        f"<table><tr><th>expected</th><td>{_e(_status_text(side.expected_status))}</td></tr>"
        f"<tr><th>observed</th><td>{_e(_status_text(side.status))} "
        f'<span class="verdict {"pass" if side.as_expected else "fail"}">{outcome}</span></td></tr></table>'
        f"{detail}{figures}</article>"
    )


def _status_text(status: str) -> str:
    return {
        "reproduced": "reproduced: the bug is present",
        "not_reproduced": "not reproduced: the bug is absent",
        "inconclusive": "inconclusive: runs disagreed",
        "infra_failure": "infrastructure failure: no verdict",
    }.get(status, status)


def _same_image(refs: list[ArtifactRef]) -> list[list[ArtifactRef]]:
    """Screenshots grouped by content, in first-seen order: identical pixels are shown once."""
    groups: dict[str, list[ArtifactRef]] = {}
    for ref in refs:
        groups.setdefault(ref.sha256, []).append(ref)
    return list(groups.values())


def _figure(refs: list[ArtifactRef], store: ArtifactStore) -> str:
    ref = refs[0]
    names = ", ".join(_e(r.name) for r in refs)
    caption = f"<figcaption>{names} <span class='sha'>{ref.sha256[:16]}</span></figcaption>"
    if not ref.media_type.startswith("image/") or ref.size > _INLINE_IMAGE_MAX:
        return f"<figure>{_link(ref, store)}{caption}</figure>"
    data = base64.b64encode(store.read_bytes(ref)).decode("ascii")
    return f'<figure><img src="data:{_e(ref.media_type)};base64,{data}" alt="{_e(ref.name)}">{caption}</figure>'


def _steps(bundle: EvidenceBundle, store: ArtifactStore) -> str:
    text = store.read_bytes(bundle.procedure).decode("utf-8", errors="replace")
    head = f'<section id="steps"><h2>Reproduction procedure</h2><p>{_link(bundle.procedure, store)}</p>'
    try:
        procedure: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        procedure = None
    if not isinstance(procedure, dict) or not isinstance(procedure.get("steps"), list):
        return f"{head}<pre>{_e(text)}</pre></section>"
    name = f"<p><strong>{_e(str(procedure['name']))}</strong></p>" if procedure.get("name") else ""
    steps = "".join(f"<li>{_describe(step)}</li>" for step in procedure["steps"])
    checks = procedure.get("bug_present")
    present = ""
    if isinstance(checks, list) and checks:
        present = "<p>The bug is present when all of these hold:</p><ul>" + "".join(
            f"<li>{_describe(c)}</li>" for c in checks
        )
        present += "</ul>"
    runs = procedure.get("runs")
    repeat = f'<p class="note">Run {_e(str(runs))} times; runs that disagree are inconclusive.</p>' if runs else ""
    return f"{head}{name}<ol>{steps}</ol>{present}{repeat}</section>"


def _describe(item: object) -> str:
    if not isinstance(item, dict):
        return f"<code>{_e(str(item))}</code>"
    action = item.get("action")
    params = ", ".join(f"{_e(str(k))}=<code>{_e(repr(v))}</code>" for k, v in item.items() if k != "action")
    return f"<strong>{_e(str(action))}</strong> {params}" if action else params


def _patch(bundle: EvidenceBundle, store: ArtifactStore) -> str:
    head = f'<section id="patch"><h2>Patch</h2><p>{_link(bundle.patch, store)}</p>'
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
        return '<section id="checks"><h2>Checks</h2><p class="note">no checks were run</p></section>'
    rows = []
    tails = []
    for check in checks:
        result = "passed" if check.passed else "failed"
        verdict = f'<span class="verdict {"pass" if check.passed else "fail"}">{result}</span>'
        output = _link(check.output, store) if check.output else ""
        rows.append(f"<tr><td>{_e(check.name)}</td><td>{verdict}</td><td>{_e(check.detail)}</td><td>{output}</td></tr>")
        if check.output is not None and check.output.size <= _INLINE_TEXT_MAX:
            text = store.read_bytes(check.output).decode("utf-8", errors="replace")
            tail = "\n".join(text.splitlines()[-_TEST_OUTPUT_TAIL_LINES:])
            tails.append(
                f"<details><summary>{_e(check.name)}: output (last lines)</summary><pre>{_e(tail)}</pre></details>"
            )
    return (
        '<section id="checks"><h2>Checks</h2><table><tr><th>check</th><th>result</th><th>detail</th>'
        "<th>output</th></tr>" + "".join(rows) + "</table>" + "".join(tails) + "</section>"
    )


def _traces(bundle: EvidenceBundle, store: ArtifactStore) -> str:
    items = []
    for side in (bundle.base, bundle.candidate):
        for ref in [*side.traces, *side.videos, *side.logs]:
            items.append(f"<li>{side.role} <code>{_e(side.revision[:12])}</code>: {_link(ref, store)}</li>")
    listing = "".join(items) or "<li>none recorded</li>"
    return (
        '<section id="traces"><h2>Traces, videos and logs</h2><ul>'
        + listing
        + '</ul><p class="note">Download a trace and open it with <code>playwright show-trace FILE</code> '
        "to step through the run's actions, DOM snapshots, console and network.</p></section>"
    )


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


def _link(ref: ArtifactRef, store: ArtifactStore) -> str:
    return f'<a href="{_e(store.url_for(ref))}">{_e(ref.name)}</a> <span class="sha">sha256 {ref.sha256}</span>'


def _e(text: str) -> str:
    return html.escape(text, quote=True)
