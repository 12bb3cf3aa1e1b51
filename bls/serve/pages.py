"""``/debug/requests``: recent requests, and one request's stage timeline as a Gantt chart.

The pages are self-contained HTML (inline CSS, no script, nothing fetched), so they
render anywhere the server is reachable, including an air-gapped cluster.
"""

from __future__ import annotations

import html
import os
import time
from typing import Any

import msgspec

from ..tracing import Span, Trace

__all__ = ["index_page", "summary", "trace_page"]

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:20px;margin:0 0 4px} .meta{color:#5b6475;margin-bottom:16px}
table{border-collapse:collapse}
td,th{padding:4px 10px;text-align:left;border-bottom:1px solid #e3e6ec}
a{color:#2454c5;text-decoration:none} a:hover{text-decoration:underline}
.gantt{border:1px solid #d5d9e2;border-radius:6px;padding:8px 0;min-width:900px}
.row{display:flex;align-items:center;height:26px}
.row:nth-child(even){background:#f6f7fa}
.label{width:300px;flex:none;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;padding-right:8px}
.label small{color:#6b7385}
.lane{position:relative;flex:1;height:18px;margin-right:16px}
.bar{position:absolute;top:0;height:18px;border-radius:3px;min-width:2px;
     font-size:11px;line-height:18px;color:#fff;padding-left:4px;box-sizing:border-box;
     overflow:hidden;white-space:nowrap}
.ok{background:#3f7fd9} .remote.ok{background:#2f9e8f}
.error{background:#d64545} .deadline{background:#d98a1f}
.cancelled{background:repeating-linear-gradient(45deg,#8b93a5,#8b93a5 5px,#aab1c0 5px,#aab1c0 10px);
           outline:2px dashed #5b6475}
.running{background:#b9c2d3}
.axis{display:flex;margin-left:300px;margin-right:16px;color:#6b7385;font-size:11px;
      justify-content:space-between;padding:2px 0 6px}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:4px;
          vertical-align:-1px}
"""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms" if seconds < 1 else f"{seconds:.3f} s"


def _calls(trace: Trace) -> int:
    """Stage calls made by the request's own process (not the request, not worker spans)."""
    return sum(1 for s in trace.spans if s.parent != 0 and not s.remote)


def _ordered(spans: list[Span]) -> list[tuple[Span, int]]:
    """Spans depth-first (children under their parent, siblings by start), with depth."""
    children: dict[int, list[Span]] = {}
    ids = {s.id for s in spans}
    for span in spans:
        parent = span.parent if span.parent in ids else 0
        children.setdefault(parent, []).append(span)
    out: list[tuple[Span, int]] = []

    def walk(parent: int, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: (s.start, s.id)):
            out.append((span, depth))
            walk(span.id, depth + 1)

    walk(0, 0)
    return out


def summary(trace: Trace, *, spans: bool = False) -> dict[str, Any]:
    """A trace as JSON-ready data (``Accept: application/json`` on the debug routes)."""
    data: dict[str, Any] = {
        "id": trace.id,
        "process": os.getpid(),  # (whose: with --processes N, each keeps its own)
        "entry": trace.entry,
        "status": trace.status,
        "start": trace.start,
        "duration": trace.duration,
        "stage_calls": _calls(trace),
    }
    if spans:
        data["spans"] = msgspec.to_builtins(trace.spans)
    return data


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )


def index_page(traces: list[Trace], title: str) -> str:
    rows = []
    for trace in traces:
        when = time.strftime("%H:%M:%S", time.localtime(trace.start))
        calls = _calls(trace)
        rows.append(
            f"<tr><td><a href='/debug/requests/{html.escape(trace.id)}'>"
            f"{html.escape(trace.id)}</a></td><td>{html.escape(trace.entry)}</td>"
            f"<td>{trace.status}</td><td>{when}</td><td>{_ms(trace.duration)}</td>"
            f"<td>{calls}</td></tr>"
        )
    table = (
        "<table><tr><th>request</th><th>entry</th><th>status</th><th>started</th>"
        "<th>duration</th><th>stage calls</th></tr>" + "".join(rows) + "</table>"
        if rows
        else "<p>No requests yet.</p>"
    )
    return _page(
        f"{title}: recent requests",
        f"<h1>Recent requests</h1><div class='meta'>{html.escape(title)} · newest first"
        f" · served by process {os.getpid()}</div>{table}",
    )


def trace_page(trace: Trace) -> str:
    """One request's task tree: a bar per span on a shared time axis."""
    ordered = _ordered(trace.spans)
    now = time.time()
    t0 = min([trace.start, *(s.start for s in trace.spans)])
    t1 = max([t0 + 1e-6, *((s.end or now) for s in trace.spans)])
    total = t1 - t0
    rows = []
    for span, depth in ordered:
        end = span.end or now
        left = (span.start - t0) / total * 100
        width = max((end - span.start) / total * 100, 0.2)
        classes = ["bar", span.outcome] + (["remote"] if span.remote else [])
        where = span.binding + (f" @ {span.replica}" if span.replica else "")
        short = f"@ {span.replica}" if span.replica else span.binding
        facts = [
            f"{span.name}: {span.outcome}{' (' + span.kind + ')' if span.kind else ''}",
            f"{_ms(end - span.start)} from +{_ms(span.start - t0)}",
            where,
        ]
        if span.bytes_out or span.bytes_in:
            facts.append(f"{span.bytes_out} B out, {span.bytes_in} B in")
        if span.streaming:
            facts.append(f"{span.items} item(s)")
        mark = " ✕ cancelled" if span.outcome == "cancelled" else ""
        kind = " <small>remote</small>" if span.remote else ""
        rows.append(
            f"<div class='row span' data-name='{html.escape(span.name)}' "
            f"data-outcome='{span.outcome}' data-depth='{depth}' "
            f"data-remote='{str(span.remote).lower()}'>"
            f"<div class='label' style='padding-left:{8 + depth * 18}px'>"
            f"{html.escape(span.name)}{kind} <small>{html.escape(short)}</small></div>"
            f"<div class='lane'><div class='{' '.join(classes)}' "
            f"style='left:{left:.3f}%;width:{width:.3f}%' "
            f"title='{html.escape(' · '.join(facts))}'>{_ms(end - span.start)}{mark}</div>"
            f"</div></div>"
        )
    ticks = "".join(f"<span>+{_ms(total * i / 4)}</span>" for i in range(5))
    legend = "".join(
        f"<span><i class='{cls}'></i>{name}</span>"
        for cls, name in (
            ("ok", "ok"),
            ("remote ok", "remote (reported by a worker)"),
            ("error", "error"),
            ("deadline", "deadline"),
            ("cancelled", "cancelled"),
        )
    )
    body = (
        f"<h1>{html.escape(trace.entry)} · request {html.escape(trace.id)}</h1>"
        f"<div class='meta'>status {trace.status} · {_ms(trace.duration)} · "
        f"{_calls(trace)} stage call(s) · <a href='/debug/requests'>all requests</a></div>"
        f"<div class='legend meta'>{legend}</div>"
        f"<div class='gantt'><div class='axis'>{ticks}</div>{''.join(rows)}</div>"
    )
    return _page(f"request {trace.id}", body)
