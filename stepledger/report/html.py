"""A compare report as one self-contained HTML page: ``stepledger compare ... --html FILE``.

The page needs nothing but itself (no network, no external script, font or image; its CSS and a few lines of
script are inline), as coverage.py's HTML report does. In order: the summary (the count line, the counts by
kind of difference and by field, the notes and the hints), a legend of the fields' colours, for multi-agent
env ledgers a grid of env copies by agents, then one row per stream: a bar of its run with a mark where the
two streams part ways and, with ``--all``, a strip per field where the later differences fall (in
``SPREAD_BINS`` parts). Each row links to its stream's detail (its report line and both sides' values) and to
its line in the text report at the end of the page. The script only filters the rows (a search box, and
"only streams that differ", on by default past ``FEW_STREAMS`` streams); without it every row shows.

Every line the text report prints comes from the Report (worded in ``stepledger.wording``); what the page
adds (section titles, column heads) is here. Everything that comes from a ledger (an agent's name, a file
name, a value) is escaped: a page never carries markup a ledger brought.
"""

from __future__ import annotations

import html
import os
from typing import TYPE_CHECKING, Any, Iterable

from stepledger import wording
from stepledger.format import schema as S
from stepledger.format.ledgerfile import atomic_file

if TYPE_CHECKING:
    from stepledger.report.compare import EnvDifference, Report

# Each field's colour (Okabe-Ito, readable with the common colour blindnesses), and the differences that are
# no field's: streams of different lengths, a stream on one side only, events two trainer files hold.
COLOURS = {"kind": "#cc79a7", "action": "#e69f00", "obs": "#0072b2", "reward": "#d55e00", "terminated": "#009e73",
           "truncated": "#b59f00", "length": "#7f7f7f", "one_side": "#222222", "overlap": "#56b4e9"}
WHAT_WORDS = {"length": "one stream stops early", "one_side": "on one side only",
              "overlap": "events two trainer files hold"}
FEW_STREAMS = 50  # past this many streams, the page opens showing only the streams that differ

_CSS = """
:root{--ok:#1a7f37;--bad:#b42318;--warn:#9a6700;--line:#d0d7de;--muted:#57606a}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#fff;border-bottom:1px solid var(--line);padding:16px 28px}
h1{font-size:20px;margin:0 0 2px}h2{font-size:16px;margin:22px 0 8px}
.src{color:var(--muted);font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
main{padding:4px 28px 40px;max-width:1400px}
.verdict{display:inline-block;font-size:17px;font-weight:600;padding:6px 14px;border-radius:6px;margin:10px 0 4px}
.verdict.ok{background:#dafbe1;color:var(--ok)}.verdict.differ{background:#ffebe9;color:var(--bad)}
.verdict.incomplete{background:#fff8c5;color:var(--warn)}
.counts{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0}
.count{background:#fff;border:1px solid var(--line);border-radius:6px;padding:6px 12px;min-width:90px}
.count b{display:block;font-size:18px}.count span{color:var(--muted);font-size:12px}
.hints,.notes{margin:6px 0;padding-left:20px}.hints li{color:var(--warn);margin:3px 0}.notes li{color:var(--muted)}
.legend{display:flex;flex-wrap:wrap;gap:14px;font-size:12px;color:var(--muted)}
.how{color:var(--muted);font-size:12px;margin:4px 0 10px}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;vertical-align:-1px;margin-right:4px}
table{border-collapse:collapse;background:#fff;border:1px solid var(--line)}
th,td{padding:3px 8px;border-bottom:1px solid #eaeef2;text-align:left;vertical-align:middle}
th{background:#f6f8fa;font-weight:600;font-size:12px;position:sticky;top:0;z-index:1}
#streams{width:100%}#streams td.n{white-space:nowrap;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
#streams td.where{white-space:nowrap;font-size:12px;color:var(--muted)}
td.barcell{width:45%;min-width:220px}
.run{position:relative;height:12px;background:#e6efe8;border-radius:3px}
.run .part{position:absolute;top:0;bottom:0;right:0;background:repeating-linear-gradient(135deg,#f3d6d3 0 4px,#fbeceb 4px 8px);border-radius:0 3px 3px 0}
.run .mark{position:absolute;top:-3px;bottom:-3px;width:4px;margin-left:-2px;border-radius:2px}
.run .stop{position:absolute;top:0;bottom:0;right:0;background:#fff;border-left:2px solid #7f7f7f}
.spread{height:5px;margin-top:2px;border-radius:2px;background-color:#f0f2f4}
tr.a td{color:var(--muted)}tr.a .run{background:#eef3ef}
.tag{display:inline-block;font-size:11px;padding:0 6px;border-radius:9px;color:#fff;margin:1px 2px 1px 0}
.controls{display:flex;gap:16px;align-items:center;margin:6px 0 8px;font-size:13px}
.controls input[type=search]{padding:4px 8px;border:1px solid var(--line);border-radius:6px;width:260px}
#shown{color:var(--muted)}
.grid td{padding:0;border:1px solid #fff}.grid th{font-size:11px}
.grid a{display:block;width:26px;height:18px}.grid a.a{background:#cfe8d5}
.detail{background:#fff;border:1px solid var(--line);border-radius:6px;padding:10px 14px;margin:8px 0}
.detail h3{font-size:14px;margin:0 0 6px}.detail .line,.report li{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-word}
.detail table{margin:6px 0}.detail td,.detail th{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;max-width:560px;word-break:break-word}
.detail .more{color:var(--muted);font-size:12px;margin:2px 0}
.report{list-style:none;padding:10px 14px;margin:0;background:#fff;border:1px solid var(--line);border-radius:6px}
.report li{padding:1px 0}:target{outline:2px solid #0969da;outline-offset:2px}
a{color:#0969da;text-decoration:none}a:hover{text-decoration:underline}
"""

# Filters the rows: the search box and the "only streams that differ" box; shows how many rows are shown.
_JS = """
(function(){var q=document.getElementById('q'),only=document.getElementById('only'),
out=document.getElementById('shown'),rows=document.querySelectorAll('#streams tbody tr');
function show(){var t=q.value.trim().toLowerCase(),n=0;for(var i=0;i<rows.length;i++){var r=rows[i],
v=(!only.checked||r.className==='d')&&(!t||r.textContent.toLowerCase().indexOf(t)>=0);r.hidden=!v;if(v)n++;}
out.textContent=n+' of '+rows.length+' streams shown';}
q.addEventListener('input',show);only.addEventListener('change',show);show();})();
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _colour(d: EnvDifference) -> str:
    """The colour of a difference's mark: its first field's, or its kind of difference's."""
    if d.what == "fields" and d.fields:
        return COLOURS[d.fields[0]]
    return COLOURS[d.what if d.what in COLOURS else "kind"]


def _mark_style(d: EnvDifference) -> str:
    """A mark with a stripe per differing field."""
    if d.what != "fields" or len(d.fields) < 2:
        return "background:%s" % _colour(d)
    step = 100.0 / len(d.fields)
    stops = ",".join("%s %.1f%% %.1f%%" % (COLOURS[f], k * step, (k + 1) * step) for k, f in enumerate(d.fields))
    return "background:linear-gradient(%s)" % stops


def _spread_style(field: str, bins: list[int]) -> str:
    """One strip: the parts of the stream where ``field`` differs, in its colour, runs of parts merged."""
    n = len(bins)
    stops, k = [], 0
    while k < n:
        j = k
        while j + 1 < n and bool(bins[j + 1]) == bool(bins[k]):
            j += 1
        colour = COLOURS[field] if bins[k] else "transparent"
        stops.append("%s %.1f%% %.1f%%" % (colour, 100.0 * k / n, 100.0 * (j + 1) / n))
        k = j + 1
    return "background-image:linear-gradient(90deg,%s)" % ",".join(stops)


def _pct(x: float) -> str:
    return "%.2f%%" % max(0.0, min(100.0, x))


def _bar(d: EnvDifference | None) -> str:
    """A stream's run: agreeing in green, from the first difference on hatched, with a mark there."""
    if d is None:
        return '<div class="run"></div>'
    total = max(d.env_events or 0, d.trainer_events or 0, 1)
    if d.what == "one_side":
        return '<div class="run" style="background:%s"></div>' % COLOURS["one_side"]
    if d.what == "length":
        shared = min(d.env_events or 0, d.trainer_events or 0)
        return '<div class="run"><span class="stop" style="left:%s"></span></div>' % _pct(100.0 * shared / total)
    at = 100.0 * (d.event or 0) / total
    out = ['<div class="run"><span class="part" style="left:%s"></span><span class="mark" style="left:%s;%s">'
           '</span></div>' % (_pct(at), _pct(at), _mark_style(d))]
    shared = max(min(d.env_events or 0, d.trainer_events or 0), 1)
    for f in S.FIELDS:
        if f in d.spread:
            out.append('<div class="spread" data-field="%s" style="width:%s;%s"></div>'
                       % (f, _pct(100.0 * shared / total), _spread_style(f, d.spread[f])))
    return "".join(out)


def _tags(d: EnvDifference) -> str:
    names = d.fields if d.what in ("fields", "kind") and d.fields else (d.what,)
    return "".join('<span class="tag" style="background:%s">%s</span>'
                   % (COLOURS.get(f, COLOURS["kind"]), _e(f.replace("_", " "))) for f in names)


def _where(d: EnvDifference) -> str:
    if d.episode is None or d.step is None:
        return ""
    text = wording.position(d.episode, d.step)
    return text + (" (event %d)" % d.event if d.event is not None else "")


def _values(d: EnvDifference) -> str:
    """Both sides' values of the fields that differ, where known (rewards and flags always; kept obs and
    actions)."""
    rows = []
    for f in d.fields:
        if f in d.env_values and f in d.trainer_values:
            first = d.detail.get(f) if f in ("obs", "action") else None
            rows.append("<tr><th>%s</th><td>%s</td><td>%s</td><td>%s</td></tr>"
                        % (_e(f), _e(d.env_values[f]), _e(d.trainer_values[f]), _e(first) if first else ""))
    if not rows:
        return ""
    return ('<table class="values"><thead><tr><th>field</th><th>%s</th><th>%s</th><th>%s</th></tr></thead>'
            "<tbody>%s</tbody></table>" % (_e(wording.ENV_GAVE), _e(wording.TRAINER_RECEIVED), _e(wording.FIRST_AT),
                                           "".join(rows)))


def _detail(d: EnvDifference, count_all: bool) -> str:
    name = wording.stream_name(d.env, d.agents)
    more = []
    if count_all and d.counts:
        more.append(wording.counts_line(d.env, d.counts, d.agents))
        more += ["%s: %s" % (name, text) for text in d.patterns]
    if d.trainer_file:
        more.append("trainer file: %s" % d.trainer_file)
    return ('<div class="detail" id="d-%d"><h3><a href="#s-%d">%s</a> %s</h3><div class="line">'
            '<a href="#l-%d">%s</a></div>%s%s</div>'
            % (d.env, d.env, _e(name), _tags(d), d.env, _e(d.line()), _values(d),
               "".join('<p class="more">%s</p>' % _e(m) for m in more)))


def _summary(report: Report) -> str:
    diffs = report.differences
    n = len(report.envs)
    streams = wording.streams_word(report.agent_streams)
    counts: list[tuple[int, str, str | None]] = [(n, "%s compared" % streams, None), (len(diffs), "differ", None), (n - len(diffs), "agree", None)]
    by_field = {f: sum(1 for d in diffs if d.what in ("fields", "kind") and f in d.fields) for f in S.FIELDS}
    counts += [(k, "differ first in %s" % f, COLOURS[f]) for f, k in by_field.items() if k]
    for what, words in WHAT_WORDS.items():
        k = sum(1 for d in diffs if d.what == what)
        if k and what in COLOURS:
            counts.append((k, words, COLOURS[what]))
    if report.unread:
        counts.append((len(report.unread), "files not read", None))
    cls = "differ" if not report.ok else "ok" if report.complete else "incomplete"
    verdict = wording.envs_differ(len(diffs), n, report.agent_streams)
    out = ['<p class="verdict %s" id="verdict">%s</p>' % (cls, _e(verdict))]
    agents = wording.agents_differ(diffs)
    if agents:
        out.append("<p>%s</p>" % _e(agents))
    out.append('<div class="counts">%s</div>' % "".join(
        '<div class="count"%s><b>%d</b><span>%s</span></div>'
        % (' style="border-left:4px solid %s"' % colour if colour else "", k, _e(words)) for k, words, colour in counts))
    hints = ([wording.VALUES_HINT] if report.values_hint else []) + list(report.hints)
    if hints:
        out.append('<ul class="hints" id="hints">%s</ul>' % "".join("<li>%s</li>" % _e(h) for h in hints))
    if report.notes:
        out.append('<ul class="notes" id="notes">%s</ul>' % "".join("<li>%s</li>" % _e(n) for n in report.notes))
    return "".join(out)


def _legend(count_all: bool) -> str:
    keys = "".join('<span><i class="sw" style="background:%s"></i>%s</span>' % (c, _e(f.replace("_", " ")))
                   for f, c in COLOURS.items())
    how = ("Each bar is a stream's run: green where its two sides agree, hatched from the first difference on, "
           "with a mark there in the colours of the fields that differ%s."
           % ("; below it, a strip per field marks where that field's later differences fall" if count_all else
              " (with --all, also where the later differences fall)"))
    return '<div class="legend">%s</div><p class="how">%s</p>' % (keys, _e(how))


def _grid(report: Report, by_env: dict[int, EnvDifference]) -> str:
    """Multi-agent env ledgers: env copies (rows) by agents (columns), each cell its stream's colour."""
    agents = report.agents
    if not report.agent_streams or not agents:
        return ""
    n = len(agents)
    copies = sorted({e // n for e in report.envs})
    present = set(report.envs)
    head = "<tr><th>env copy</th>%s</tr>" % "".join("<th>%s</th>" % _e(a) for a in agents)
    rows = []
    for c in copies:
        cells = []
        for k in range(n):
            e = c * n + k
            d = by_env.get(e)
            if e not in present:
                cells.append("<td></td>")
            elif d is None:
                cells.append('<td><a class="a" href="#s-%d" title="%s"></a></td>'
                             % (e, _e(wording.stream_name(e, agents))))
            else:
                cells.append('<td><a href="#d-%d" title="%s" style="%s"></a></td>' % (e, _e(d.line()), _mark_style(d)))
        rows.append("<tr><th>%d</th>%s</tr>" % (c, "".join(cells)))
    return ('<h2>Env copies by agents</h2><table class="grid" id="grid"><thead>%s</thead><tbody>%s</tbody></table>'
            % (head, "".join(rows)))


def _rows(report: Report, by_env: dict[int, EnvDifference]) -> Iterable[str]:
    for e in report.envs:
        d = by_env.get(e)
        if d is None:
            name = wording.stream_name(e, report.agents if report.agent_streams else None)
            yield '<tr class="a" id="s-%d"><td class="n">%s</td><td class="barcell">%s</td><td></td><td></td></tr>' % (
                e, _e(name), _bar(None))
        else:
            yield ('<tr class="d" id="s-%d"><td class="n"><a href="#d-%d">%s</a></td><td class="barcell">%s</td>'
                   '<td class="where">%s</td><td>%s</td></tr>'
                   % (e, e, _e(wording.stream_name(e, d.agents)), _bar(d), _e(_where(d)), _tags(d)))


def _text_report(report: Report) -> str:
    lines = report.lines()
    items = ['<li id="l-%d"><a href="#d-%d">%s</a></li>' % (d.env, d.env, _e(d.line())) for d in report.differences]
    items += ["<li>%s</li>" % _e(line) for line in lines[len(report.differences):]]
    return '<ul class="report" id="report">%s</ul>' % "".join(items)


def to_html(report: Report, title: str | None = None) -> str:
    """The page of ``report`` (a compare Report); ``title`` names what was compared (the command's arguments)."""
    by_env = report.by_env()
    n = len(report.envs)
    src = "<div class=\"src\">%s</div>" % _e(title) if title else ""
    if report.trainer_files:
        src += '<div class="src">trainer files: %s</div>' % _e(", ".join(report.trainer_files))
    only = " checked" if n > FEW_STREAMS and report.differences else ""
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        "<title>stepledger compare: %s</title>" % _e(wording.envs_differ(len(report.differences), n,
                                                                         report.agent_streams)),
        "<style>%s</style></head><body>" % _CSS,
        "<header><h1>stepledger compare</h1>%s%s</header><main>" % (src, _summary(report)),
        "<h2>Where the streams part ways</h2>%s" % _legend(report.count_all),
        _grid(report, by_env),
        '<div class="controls"><input type="search" id="q" placeholder="filter: env 3, reward, agent_1 ..." '
        'aria-label="filter the streams"><label><input type="checkbox" id="only"%s> only streams that differ</label>'
        '<span id="shown"></span></div>' % only,
        '<table id="streams"><thead><tr><th>stream</th><th>the run%s</th><th>first difference</th><th>fields</th>'
        "</tr></thead><tbody>" % (": where the streams part ways, and where later differences fall" if report.count_all
                                  else ": where the streams part ways"),
    ]
    parts.extend(_rows(report, by_env))
    parts.append("</tbody></table>")
    if report.differences:
        parts.append("<h2>Streams that differ</h2>")
        parts.extend(_detail(d, report.count_all) for d in report.differences)
    parts.append("<h2>The text report</h2>%s" % _text_report(report))
    parts.append("</main><script>%s</script></body></html>\n" % _JS)
    return "".join(parts)


def write_html(report: Report, path: str | os.PathLike[str], title: str | None = None) -> None:
    """Write the page of ``report`` to ``path``, atomically."""
    with atomic_file(os.fspath(path)) as f:
        f.write(to_html(report, title).encode("utf-8"))


def write_html_error(path: str | os.PathLike[str], message: str, title: str | None = None) -> None:
    """The page of a compare that could not run (exit 2): the one line it printed on stderr."""
    page = ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>stepledger compare: cannot compare'
            '</title><style>%s</style></head><body><header><h1>stepledger compare</h1>%s<p class="verdict differ" '
            'id="verdict">%s</p></header></body></html>\n'
            % (_CSS, '<div class="src">%s</div>' % _e(title) if title else "", _e(message)))
    with atomic_file(os.fspath(path)) as f:
        f.write(page.encode("utf-8"))
