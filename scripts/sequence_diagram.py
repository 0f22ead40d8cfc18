"""Mermaid sequence diagrams drawn as SVG at build time, so the docs need no script from a CDN.

The docs keep their diagrams as ```mermaid fences (GitHub renders those itself); the site's
build (scripts/mkdocs_hooks.py) replaces each with the SVG this module draws, so a page read
without a network — `mkdocs serve` on an air-gapped host, or the built site opened from disk —
shows its diagrams. Only the part of Mermaid's sequenceDiagram syntax the docs use is read:

    sequenceDiagram
    participant A as party a        (or: participant A)
    A->>C: message                  (solid arrow; -->> dashed, for a reply)
    Note over A,B: text             (over one participant or spanning two)
    loop text ... end

`<br/>` breaks a line; a long message is wrapped to the space between its participants. Any
other line is an error naming it, so a diagram never silently loses a part.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from html import escape

CHAR = 7.4  # px per character at FONT px, a generous average for sans-serif text
FONT = 14
LINE = 18  # px per line of text
GAP = 250  # px between neighbouring lifelines (at most)
MIN_GAP = 170
WIDTH = 720  # px a diagram aims to fit in (the width of a page's text)
NOTE_HALF = 130  # px a note over one participant reaches to either side
BOX_H = 36
MARGIN = 20


class DiagramError(ValueError):
    pass


@dataclass
class _Item:
    kind: str  # "message", "note", "loop", "end"
    text: list[str]
    src: str = ""
    dst: str = ""
    dashed: bool = False
    over: tuple[str, ...] = ()


@dataclass
class _Diagram:
    participants: dict[str, str] = field(default_factory=dict)  # id -> label, in order
    items: list[_Item] = field(default_factory=list)


_PARTICIPANT = re.compile(r"participant\s+(\w+)(?:\s+as\s+(.+))?$")
_MESSAGE = re.compile(r"(\w+)\s*(-->>|->>)\s*(\w+)\s*:\s*(.*)$")
_NOTE = re.compile(r"Note\s+over\s+(\w+)(?:\s*,\s*(\w+))?\s*:\s*(.*)$")
_LOOP = re.compile(r"loop\s+(.*)$")


def _lines(text: str) -> list[str]:
    return [part.strip() for part in re.split(r"<br\s*/?>", text)]


def parse(source: str) -> _Diagram:
    lines = [line.strip() for line in source.strip().splitlines()]
    if not lines or lines[0] != "sequenceDiagram":
        raise DiagramError(f"only sequenceDiagram is drawn, not {lines[0] if lines else 'an empty diagram'!r}")
    diagram, depth = _Diagram(), 0

    def known(pid: str, number: int) -> str:
        if pid not in diagram.participants:
            raise DiagramError(f"line {number}: {pid!r} is not a declared participant")
        return pid

    for number, line in enumerate(lines[1:], start=2):
        if not line or line.startswith("%%"):
            continue
        if m := _PARTICIPANT.match(line):
            diagram.participants[m[1]] = (m[2] or m[1]).strip()
        elif m := _MESSAGE.match(line):
            diagram.items.append(_Item("message", _lines(m[4]), known(m[1], number), known(m[3], number),
                                       dashed=m[2] == "-->>"))
        elif m := _NOTE.match(line):
            over = tuple(known(p, number) for p in (m[1], m[2]) if p)
            diagram.items.append(_Item("note", _lines(m[3]), over=over))
        elif m := _LOOP.match(line):
            depth += 1
            diagram.items.append(_Item("loop", _lines(m[1])))
        elif line == "end":
            if depth == 0:
                raise DiagramError(f"line {number}: 'end' without a loop")
            depth -= 1
            diagram.items.append(_Item("end", []))
        else:
            raise DiagramError(f"line {number}: {line!r} is not sequenceDiagram syntax this renderer knows "
                               "(participant, A->>B: text, A-->>B: text, Note over A[,B]: text, loop, end)")
    if depth:
        raise DiagramError("a loop has no 'end'")
    if not diagram.participants:
        raise DiagramError("the diagram declares no participant")
    return diagram


def _wrap(lines: list[str], width_px: float) -> list[str]:
    chars = max(12, int(width_px / CHAR))
    return [wrapped for line in lines for wrapped in (textwrap.wrap(line, chars) or [""])]


def _text(x: float, y: float, lines: list[str], anchor: str = "middle", cls: str = "") -> str:
    spans = "".join(f'<tspan x="{x:.0f}" dy="{0 if i == 0 else LINE}">{escape(line)}</tspan>'
                    for i, line in enumerate(lines))
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.0f}" y="{y:.0f}" text-anchor="{anchor}"{klass}>{spans}</text>'


def render(source: str, title: str = "sequence diagram") -> str:
    """The diagram as one line of SVG markup (inline in a page; its `title` for screen readers)."""
    d = parse(source)
    ids = list(d.participants)
    box_w = {p: max(110.0, len(label) * CHAR + 24) for p, label in d.participants.items()}
    # lifelines GAP apart, closer when that keeps the diagram within a page's width (WIDTH)
    ends = (box_w[ids[0]] + box_w[ids[-1]]) / 2
    gap = GAP if len(ids) < 2 else max(MIN_GAP, min(GAP, (WIDTH - ends) / (len(ids) - 1)))
    x, first = {}, MARGIN + box_w[ids[0]] / 2
    for i, p in enumerate(ids):
        x[p] = first + i * gap
    left, right = MARGIN, x[ids[-1]] + box_w[ids[-1]] / 2 + MARGIN
    parts: list[str] = []
    y = MARGIN
    for p in ids:
        parts.append(f'<rect class="actor" x="{x[p] - box_w[p] / 2:.0f}" y="{y}" width="{box_w[p]:.0f}" '
                     f'height="{BOX_H}" rx="4"/>')
        parts.append(_text(x[p], y + BOX_H / 2 + 5, [d.participants[p]]))
    y += BOX_H + 24
    body_top = y
    loops: list[tuple[float, list[str]]] = []
    for item in d.items:
        if item.kind == "message":
            a, b = x[item.src], x[item.dst]
            lines = _wrap(item.text, abs(b - a) - 24)
            mid = (a + b) / 2
            parts.append(_text(mid, y + FONT, lines))
            y += len(lines) * LINE + 6
            end = b - 8 if b > a else b + 8
            dash = ' stroke-dasharray="6 4"' if item.dashed else ""
            parts.append(f'<line class="msg" x1="{a:.0f}" y1="{y:.0f}" x2="{end:.0f}" y2="{y:.0f}"{dash}/>')
            tip = 1 if b > a else -1
            parts.append(f'<path class="head" d="M{b:.0f},{y:.0f} l{-10 * tip},-5 v10 z"/>')
            y += 22
        elif item.kind == "note":
            xs = [x[p] for p in item.over]
            lo, hi = (min(xs) - 70, max(xs) + 70) if len(xs) > 1 else (xs[0] - NOTE_HALF, xs[0] + NOTE_HALF)
            lines = _wrap(item.text, hi - lo - 16)
            widest = max(len(line) for line in lines) * CHAR + 20
            if widest > hi - lo:
                lo, hi = (lo + hi) / 2 - widest / 2, (lo + hi) / 2 + widest / 2
            height = len(lines) * LINE + 12
            parts.append(f'<rect class="note" x="{lo:.0f}" y="{y:.0f}" width="{hi - lo:.0f}" height="{height}"/>')
            parts.append(_text((lo + hi) / 2, y + 6 + FONT, lines))
            left, right = min(left, lo - MARGIN), max(right, hi + MARGIN)
            y += height + 16
        elif item.kind == "loop":
            loops.append((y, item.text))
            y += LINE + 18
        else:  # end of the innermost loop: its frame around what it holds
            top, text = loops.pop()
            inset = 10 * (len(loops) + 1)
            lo, hi = left + inset, right - inset
            parts.append(f'<rect class="loop" x="{lo:.0f}" y="{top:.0f}" width="{hi - lo:.0f}" '
                         f'height="{y - top:.0f}"/>')
            parts.append(f'<path class="loop-tab" d="M{lo:.0f},{top:.0f} h50 v14 l-8,8 h-42 z"/>')
            parts.append(_text(lo + 8, top + 16, ["loop"], anchor="start", cls="label"))
            parts.append(_text(lo + 60, top + 16, [f"[{' '.join(text)}]"], anchor="start", cls="label"))
            y += 12
    bottom = y + 4
    lifelines = [f'<line class="life" x1="{x[p]:.0f}" y1="{body_top - 24 + 0:.0f}" x2="{x[p]:.0f}" '
                 f'y2="{bottom:.0f}"/>' for p in ids]
    width, height = right - left, bottom + MARGIN
    style = (f"<style>text{{font:{FONT}px sans-serif;fill:#1a1a1a}}" ".label{font-weight:bold}.actor{fill:#e8eaf6;"
             "stroke:#3f51b5}.note{fill:#fff8c4;stroke:#c8b900}.loop{fill:none;stroke:#777}.loop-tab{fill:#eee;"
             "stroke:#777}.life{stroke:#999;stroke-dasharray:3 3}.msg{stroke:#333;stroke-width:1.4}.head{fill:#333}"
             "</style>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(title)}" '
            f'viewBox="{left:.0f} 0 {width:.0f} {height:.0f}" width="{width:.0f}" style="max-width:100%;height:auto">'
            f"<title>{escape(title)}</title>{style}{''.join(lifelines)}{''.join(parts)}</svg>")
