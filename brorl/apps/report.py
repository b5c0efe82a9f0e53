"""``brorl report RUN_DIR``: one self-contained HTML page about a run, from its run directory.

It reads what the learner writes there (metrics.jsonl, config.yaml, samples.jsonl) and what the
demo adds (summary.json), and draws reward, accuracy, KL, entropy, lengths, diversity, staleness
and throughput over steps (inline SVG, brorl/apps/svg_chart.py), the resolved config, a table of
sample paths (the best, worst and a random path of every ``samples_every``-th step) and the run's
events. The page loads nothing: no script, no font, no image from anywhere, and its
Content-Security-Policy forbids it, so it opens offline and a browser flags any slip.

A resumed run repeats the steps after its last checkpoint in both JSONL files: the last line of a
step wins. Lines that do not parse (a learner killed mid-write) are left out and counted.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from brorl.apps.svg_chart import Points, fmt, line_chart

METRICS, CONFIG = "metrics.jsonl", "config.yaml"  # written by the learner (runstate, server)
SAMPLES = "samples.jsonl"  # services/learner/observe/samples_log.py (apps import no service)
SUMMARY = "summary.json"  # the demo's before/after evaluation
END_EVENTS = {"done", "stopped", "failed"}  # RunState.finish
NOT_A_STEP = {"skipped_step"}  # rows whose update statistics belong to no completed step
EVAL_PREFIX = "eval/"  # held-out evaluation metrics, when the run evaluates (docs/data.md)
EVAL_STRATUM = "eval/accuracy/"  # per stratum of the held-out prompts (data.fields.stratum)
EVAL_SHARES = ("eval/accuracy", "eval/reward_mean")  # the ones on a 0-1 scale, drawn
_BOOKKEEPING = {"step", "time", "event", "message", "groups"}  # metrics.jsonl keys, not metrics

# title and the metrics drawn (those the run has); held-out accuracy comes second (_charts)
CHARTS = [
    ("Reward (mean per path)", ["reward/mean", "learner/reward_mean"]),
    ("KL to the reference policy (0 while train.kl_coef is 0)", ["learner/kl"]),
    ("Entropy (nats)", ["learner/entropy", "explore/reward_entropy"]),
    ("Completion length (tokens)", ["rollout/length_mean", "rollout/length_p90"]),
    ("Diversity: PDI and EUR", ["explore/pdi", "explore/eur", "explore/unique_ngram_ratio"]),
    ("Staleness (weight versions)", ["rollout/staleness", "learner/staleness_mean"]),
    ("Sampling throughput (paths/s)", ["rollout/samples_per_s"]),
    ("Sampling throughput (tokens/s)", ["rollout/tokens_per_s"]),
    (
        "Step time (s)",
        ["learner/step_s", "learner/wait_s", "learner/update_s", "learner/publish_s"],
    ),
]

# Multi-turn runs (an ``env`` section): drawn only when the run has env/* metrics (the rollout
# worker's episode statistics, services/rollout/episodes.py) — a single-turn run gets none.
ENV_PREFIX = "env/"
ENV_CHARTS = [
    ("Episodes: policy turns per episode", ["env/turns_mean"]),
    ("Episodes: environment token share, failed share", ["env/token_share", "env/failed_share"]),
    ("Environment step latency (ms)", ["env/step_ms"]),
    (
        "Episodes left out (per step)",
        ["learner/excluded_paths/env_error", "learner/excluded_paths/env_timeout"],
    ),
]
LOGP_GAP_TURN = "learner/logp_gap/turn"  # + k: the learner/sampler gap on the policy's k-th turn

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
figure.chart { margin: 0; padding: 8px; border: 1px solid #ddd; width: 480px; }
figcaption { font-weight: 600; margin-bottom: 4px; }
svg .plot { fill: #fafafa; stroke: #bbb; } svg .grid { stroke: #e4e4e4; }
svg .series { fill: none; stroke-width: 1.6; }
svg text { font-size: 11px; fill: #555; } svg .ytick { text-anchor: end; }
svg .xtick { text-anchor: middle; } svg .xlabel { text-anchor: end; }
ul.legend { list-style: none; padding: 0; margin: 4px 0 0; font-size: 12px; }
.swatch { display: inline-block; width: 12px; height: 3px; margin: 0 6px 3px 0; }
.last, .note { color: #777; } .note { font-size: 12px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 3px 6px; vertical-align: top; text-align: left; }
td.text { font-family: monospace; white-space: pre-wrap; max-width: 520px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best td.kind { color: #009e73; } tr.worst td.kind { color: #d55e00; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; }
"""


@dataclass
class Run:
    """What a run directory holds, as read for the report."""

    path: Path
    steps: dict[int, dict] = field(default_factory=dict)  # step → its (last) metrics row
    events: list[dict] = field(default_factory=list)  # rows with an event, in order
    samples: dict[int, list[dict]] = field(default_factory=dict)  # step → its (last) samples
    config: str = ""
    summary: dict = field(default_factory=dict)
    bad_lines: dict[str, int] = field(default_factory=dict)  # file → lines left out

    def series(self, name: str) -> Points:
        """(step, value) of ``name`` at every step that has a finite number for it."""
        return [
            (float(step), float(row[name]))
            for step, row in sorted(self.steps.items())
            if _number(row.get(name))
        ]

    def names(self) -> set[str]:
        return {k for row in self.steps.values() for k, v in row.items() if _number(v)}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _jsonl(path: Path, run: Run) -> list[dict]:
    """The JSON objects of ``path``, one a line ([] without the file); others are counted."""
    if not path.is_file():
        return []
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        else:
            bad += 1
    if bad:
        run.bad_lines[path.name] = bad
    return rows


def load_run(run_dir: Path) -> Run:
    run = Run(Path(run_dir))
    for row in _jsonl(run.path / METRICS, run):
        if row.get("event"):
            run.events.append(row)
        if row.get("event") not in NOT_A_STEP:
            # "start" and "done" rows merge into their step; a repeated step's last row wins
            run.steps.setdefault(row["step"], {}).update(row)
    run.steps = {s: row for s, row in run.steps.items() if len(row.keys() - _BOOKKEEPING)}
    for row in _jsonl(run.path / SAMPLES, run):
        if isinstance(row.get("samples"), list):
            run.samples[row["step"]] = [s for s in row["samples"] if isinstance(s, dict)]
    if (run.path / CONFIG).is_file():
        run.config = (run.path / CONFIG).read_text(errors="replace")
    try:
        summary = json.loads((run.path / SUMMARY).read_text())
        run.summary = summary if isinstance(summary, dict) else {}
    except (OSError, ValueError):
        pass
    return run


def _accuracy_chart(run: Run) -> str:
    """Held-out accuracy: the run's eval/* metrics, and the demo's before/after evaluation
    (summary.json) as points at the first and last step."""
    shares = [n for n in sorted(run.names()) if n in EVAL_SHARES or n.startswith(EVAL_STRATUM)]
    series = {n: run.series(n) for n in shares}
    before, after = run.summary.get("accuracy_warmstart"), run.summary.get("accuracy_final")
    if _number(before) and _number(after):
        last = float(max(run.steps, default=0))
        series["held-out greedy accuracy (summary.json)"] = [(0.0, before), (last, after)]
    note = "" if series else f"no held-out evaluation in this run ({EVAL_PREFIX}* metrics)"
    return line_chart("Held-out accuracy", series, note)


def _env_charts(run: Run) -> list[tuple[str, list[str]]]:
    """The environment charts of a multi-turn run (none for a single-turn one): turns, token
    shares, step latency, failures, and the log-prob gap of every turn (token continuity)."""
    names = run.names()
    if not any(n.startswith(ENV_PREFIX) for n in names):
        return []
    gaps = [n for n in names if n.startswith(LOGP_GAP_TURN)]
    gaps.sort(key=lambda n: int(n[len(LOGP_GAP_TURN) :]))
    return ENV_CHARTS + [("Learner/sampler log-prob gap by policy turn", gaps)]


def _charts(run: Run) -> str:
    charts = [
        line_chart(title, {n: run.series(n) for n in names})
        for title, names in CHARTS + _env_charts(run)
    ]
    charts.insert(1, _accuracy_chart(run))
    return '<div class="charts">' + "".join(charts) + "</div>"


def _cell(text, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<td{attr}>{escape(str(text))}</td>"


def _samples_table(run: Run) -> str:
    if not run.samples:
        return (
            '<p class="note" id="samples">No samples.jsonl: the run wrote no sample paths '
            "(samples_every 0, or a learner older than samples.jsonl).</p>"
        )
    head = "".join(
        f"<th>{h}</th>" for h in ("step", "kind", "reward", "prompt", "reference", "completion")
    )
    rows = []
    for step, samples in sorted(run.samples.items()):
        for s in samples:
            kind = str(s.get("kind", ""))
            reward = s.get("reward")
            detail = f"tokens: {s.get('tokens', '?')}, finish: {s.get('finish_reason') or '?'}"
            rows.append(
                f'<tr class="{escape(kind)}">{_cell(step, "num")}{_cell(kind, "kind")}'
                f"{_cell(fmt(reward) if _number(reward) else reward, 'num')}"
                f"{_cell(s.get('prompt', ''), 'text')}{_cell(s.get('reference', ''), 'text')}"
                f'<td class="text">{escape(str(s.get("text", "")))}'
                f'<br><span class="note">{escape(detail)}</span></td></tr>'
            )
    return f'<table id="samples"><tr>{head}</tr>{"".join(rows)}</table>'


def _events_table(run: Run) -> str:
    if not run.events:
        return '<p class="note">No events.</p>'
    t0 = run.events[0].get("time", 0) or 0
    rows = [
        f"<tr>{_cell(e['step'], 'num')}{_cell(_elapsed(e, t0), 'num')}"
        f"{_cell(e.get('event', ''))}{_cell(e.get('message', ''))}</tr>"
        for e in run.events
    ]
    head = "<tr><th>step</th><th>seconds</th><th>event</th><th>message</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def _elapsed(row: dict, t0: float) -> str:
    t = row.get("time")
    return f"{t - t0:.1f}" if _number(t) else ""


def _last_values(run: Run) -> str:
    """Every metric's value at the last step it was logged (a closed <details>)."""
    last: dict[str, tuple[int, float]] = {}
    for step, row in sorted(run.steps.items()):
        last.update({k: (step, v) for k, v in row.items() if _number(v) and k not in _BOOKKEEPING})
    rows = "".join(
        f"<tr>{_cell(k)}{_cell(fmt(v), 'num')}{_cell(s, 'num')}</tr>"
        for k, (s, v) in sorted(last.items())
    )
    return (
        f"<details><summary>All {len(last)} metrics, last value</summary><table>"
        f"<tr><th>metric</th><th>value</th><th>step</th></tr>{rows}</table></details>"
    )


def _overview(run: Run) -> str:
    ends = [e for e in run.events if e.get("event") in END_EVENTS]
    state = ends[-1]["event"] if ends else "running, or killed (no end event)"
    message = ends[-1].get("message", "") if ends else ""
    items = [
        ("run directory", str(run.path.resolve())),
        ("state", {"done": "finished"}.get(state, state) + (f": {message}" if message else "")),
        ("last step", str(max(run.steps, default=0))),
        *[(k, fmt(v) if _number(v) else v) for k, v in run.summary.items()],
        *[(f"left out of {f}", f"lines that do not parse: {n}") for f, n in run.bad_lines.items()],
    ]
    rows = "".join(f"<tr><th>{escape(k)}</th>{_cell(v)}</tr>" for k, v in items)
    return f"<table>{rows}</table>"


def build_html(run: Run) -> str:
    title = f"brorl report: {run.path.resolve().name}"
    config = (
        f'<pre id="config">{escape(run.config)}</pre>'
        if run.config
        else f'<p class="note">No {CONFIG} in the run directory.</p>'
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{STYLE}</style></head>
<body><h1>{escape(title)}</h1>
{_overview(run)}
<h2>Over steps</h2>
{_charts(run)}
{_last_values(run)}
<h2>Sample paths (best, worst and random of a step)</h2>
{_samples_table(run)}
<h2>Resolved run config ({CONFIG})</h2>
{config}
<h2>Events</h2>
{_events_table(run)}
</body></html>
"""


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report of ``run_dir`` (default ``run_dir/report.html``); returns its path."""
    out = Path(out) if out else Path(run_dir) / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(build_html(load_run(Path(run_dir))), encoding="utf-8")
    os.replace(tmp, out)  # a browser reloading the page never sees half of it
    return out


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds metrics.jsonl)")
    p.add_argument("--out", default="", metavar="FILE", help="default: RUN_DIR/report.html")


def cmd_report(args) -> int:
    print(write_report(Path(args.run_dir), Path(args.out) if args.out else None))
    return 0
