"""``brorl report``: the sample chooser the learner writes samples.jsonl with, the run-directory
reader, and the page itself loaded in a real headless Chromium (tests/chromium.py): no console
error, every chart drawn (coloured pixels in a screenshot, not only elements in the DOM), the
sample table and the resolved config on the page.

The run directory is synthetic but shaped like a learner's: metrics.jsonl with a start row, step
rows, a skipped update, a resumed stretch that repeats steps, a line cut off mid-write and an end
row; samples.jsonl written by the learner's own writer from PathGroup protos; config.yaml dumped
from a RunConfig as the learner does; summary.json as the demo writes it.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from brorl.apps import report
from brorl.apps.svg_chart import nice_ticks
from brorl.config.base import dump
from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from services.learner.observe.samples_log import MAX_CHARS, choose_samples, write_samples
from tests import chromium

REPO = Path(__file__).resolve().parents[4]
STEPS, EVERY = 40, 5
TRICKY = "<b>04</b> & 'x'"  # must reach the page as text, never as markup


def group(gid: str, rewards: list[float], prompt: str = "12+34=") -> common_pb2.PathGroup:
    g = common_pb2.PathGroup(group_id=gid, prompt=prompt, reference="46")
    for i, r in enumerate(rewards):
        g.paths.add(text=f"{gid}-{i}", reward=r, token_ids=[1] * (i + 1), finish_reason="stop")
    return g


# ---- the sample chooser ------------------------------------------------------------------


def test_choose_samples_takes_best_worst_and_a_seeded_random_path():
    groups = [group("a", [0.5, float("nan"), 0.2]), group("b", [1.0, -1.0, 1.0])]
    samples = choose_samples(groups, step=10)
    assert [s["kind"] for s in samples] == ["best", "worst", "random"]
    best, worst, drawn = samples
    assert (best["text"], best["reward"], best["group_id"]) == ("b-0", 1.0, "b")  # first of ties
    assert (worst["text"], worst["reward"]) == ("b-1", -1.0)
    assert drawn["text"] != "a-1"  # a NaN reward is never chosen
    assert best["prompt"] == "12+34=" and best["reference"] == "46" and best["tokens"] == 1
    # the same step draws the same path, and the global generator is left alone
    state = random.getstate()
    assert choose_samples(groups, step=10)[2] == drawn
    assert random.getstate() == state
    drawn_per_step = {choose_samples(groups, step)[2]["text"] for step in range(50)}
    assert drawn_per_step == {"a-0", "a-2", "b-0", "b-1", "b-2"}


def test_choose_samples_of_nothing_is_empty():
    assert choose_samples([], 5) == []
    assert choose_samples([group("a", [float("nan"), float("inf")])], 5) == []


def test_write_samples_every_k_steps_with_texts_cut(tmp_path):
    long = group("g", [0.0, 1.0], prompt="p" * (MAX_CHARS + 50))
    for step in range(1, 13):
        write_samples(tmp_path, step, [long], every=5)
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [5, 10]
    assert len(lines[0]["samples"]) == 3
    assert len(lines[0]["samples"][0]["prompt"]) == MAX_CHARS + 1  # cut, with an ellipsis
    write_samples(tmp_path / "never", 5, [long], every=0)  # 0: never (the dir need not exist)


# ---- the run directory and its report ------------------------------------------------------


def step_row(step: int, rng: random.Random, resumed: bool = False) -> dict:
    """One learner step's metrics, with the names and magnitudes a demo run logs."""
    progress = step / STEPS
    reward = 0.3 + 0.5 * progress + rng.uniform(-0.05, 0.05)
    row = {
        "step": step,
        "time": 1_000.0 + 4 * step,
        "event": "",
        "message": "",
        "reward/mean": reward,
        "learner/reward_mean": reward - 0.05,
        "learner/kl": 0.002 * progress,
        "learner/entropy": 0.4 - 0.3 * progress,
        "explore/reward_entropy": 0.6 - 0.2 * progress,
        "rollout/length_mean": 3.9 + rng.uniform(-0.1, 0.1),
        "rollout/length_p90": 4.0,
        "explore/pdi": 0.1 - 0.05 * progress,
        "explore/eur": 0.7 + rng.uniform(-0.1, 0.1),
        "explore/unique_ngram_ratio": 0.03,
        "rollout/staleness": float(step % 3 != 0),
        "learner/staleness_mean": 0.6,
        "rollout/samples_per_s": 128.0 + rng.uniform(-10, 10),
        "rollout/tokens_per_s": 500.0 + rng.uniform(-40, 40),
        "learner/step_s": 4.8,
        "learner/wait_s": 0.1,
        "learner/update_s": 4.6,
        "learner/publish_s": 0.1,
        "learner/weight_version": float(step),
        "groups": [f"g{step}"],
    }
    if step % 10 == 0:
        row["eval/accuracy"] = 0.18 + 0.45 * progress
        row["eval/accuracy/hard"] = 0.05 * progress  # data.fields.stratum's per-stratum share
        row["eval/prompts/hard"] = 40.0
    if resumed:
        row["resumed_marker"] = 1.0
    return row


def addition_group(step: int, k: int, rng: random.Random) -> common_pb2.PathGroup:
    """The demo's task: right answers score 1, zero-padded ones ("046") 0, as exact match does."""
    a, b = rng.randrange(10, 100), rng.randrange(10, 100)
    g = common_pb2.PathGroup(group_id=f"g{step}-{k}", prompt=f"{a}+{b}=", reference=str(a + b))
    for i in range(8):
        right = rng.random() < 0.3 + 0.5 * step / STEPS
        text = str(a + b) if right else f"{a + b:04d}"
        g.paths.add(text=text, reward=float(right), token_ids=[1] * len(text), finish_reason="stop")
    return g


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return make_run_dir(tmp_path)


def make_run_dir(root: Path) -> Path:
    rng = random.Random(0)
    run = root / "demo-20261201-120000"
    run.mkdir()
    start = {"step": 0, "time": 1000.0, "event": "start", "learner/weight_version": 0.0}
    lines = [json.dumps(start)]
    for step in range(1, 26):
        lines.append(json.dumps(step_row(step, rng)))
        if step == 12:  # a skipped update: its statistics must not become step 12's
            lines.append(json.dumps({"step": 12, "event": "skipped_step", "learner/kl": 1e6}))
    lines.append('{"step": 26, "time": 1104.0, "reward/me')  # the learner was killed mid-line
    for step in range(21, STEPS + 1):  # resumed from the step-20 checkpoint: 21-25 again
        lines.append(json.dumps(step_row(step, rng, resumed=True)))
    lines.append(json.dumps({"step": STEPS, "time": 1200.0, "event": "done", "message": ""}))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for step in range(1, STEPS + 1):  # what Trainer.run does after each step
        groups = [addition_group(step, k, rng) for k in range(4)]
        if step == 25:  # a prompt with markup in it
            for g in groups:
                g.prompt = TRICKY + g.prompt
        write_samples(run, step, groups, EVERY)
    cfg = RunConfig(model="/models/demo", data={"train_path": "/data/train.jsonl"})
    (run / "config.yaml").write_text(dump(cfg))
    summary = {"run_id": run.name, "accuracy_warmstart": 0.178, "accuracy_final": 0.642}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_load_run_keeps_the_last_row_of_a_step_and_counts_bad_lines(run_dir):
    run = report.load_run(run_dir)
    assert max(run.steps) == STEPS
    assert run.bad_lines == {"metrics.jsonl": 1}
    assert all(run.steps[s].get("resumed_marker") == 1.0 for s in range(21, 26))
    assert max(v for _, v in run.series("learner/kl")) < 1  # the skipped update's 1e6 is out
    assert [e["event"] for e in run.events] == ["start", "skipped_step", "done"]
    assert [x for x, _ in run.series("eval/accuracy")] == [10.0, 20.0, 30.0, 40.0]
    chart = report._accuracy_chart(run)  # every stratum's accuracy beside the overall one
    assert "eval/accuracy/hard" in chart and "eval/prompts/hard" not in chart
    assert sorted(run.samples) == list(range(EVERY, STEPS + 1, EVERY))
    assert "samples_every: 5" in run.config


def test_a_multi_turn_run_gets_the_environment_charts_and_a_single_turn_run_none(run_dir):
    """env/* metrics (episodes) add the environment charts, the per-turn log-prob gaps in turn
    order (turn10 after turn2); the single-turn run directory draws none of them."""
    page = report.build_html(report.load_run(run_dir))
    assert all(title not in page for title, _ in report.ENV_CHARTS)
    text = (run_dir / "metrics.jsonl").read_text()
    lines = [json.loads(x) for x in text.splitlines() if x.endswith("}")]  # one line was cut
    extra = {"env/turns_mean": 2.5, "env/token_share": 0.3, "env/step_ms": 4.0}
    extra |= {f"learner/logp_gap/turn{k}": 0.01 * k for k in (1, 2, 10)}
    rows = [row if row.get("event") else {**row, **extra} for row in lines]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = report.load_run(run_dir)
    page = report.build_html(run)
    assert all(title.replace("'", "&#x27;") in page for title, _ in report.ENV_CHARTS)
    [(title, gaps)] = report._env_charts(run)[len(report.ENV_CHARTS) :]
    assert gaps == [f"learner/logp_gap/turn{k}" for k in (1, 2, 10)] and "by policy turn" in title


def test_nice_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0.0, 1.0) == [0.0, 0.5, 1.0]  # steps of 1, 2 or 5 x 10^k
    assert nice_ticks(0.0, 1.0, 6) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0.13, 0.87, enclose=True)[0] <= 0.13
    assert nice_ticks(0.13, 0.87, enclose=True)[-1] >= 0.87
    assert all(0.13 <= t <= 0.87 for t in nice_ticks(0.13, 0.87))
    assert nice_ticks(0.1, 0.7, 7) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]


PAGE_CHECKS = {
    "charts": "document.querySelectorAll('figure.chart').length",
    "empty": "document.querySelectorAll('figure.chart.empty').length",
    "drawn": "[...document.querySelectorAll('figure.chart svg')].filter(s =>"
    " s.getBoundingClientRect().width > 300 &&"
    " [...s.querySelectorAll('polyline')].some(p => p.getTotalLength() > 50)).length",
    "chart_box": "JSON.stringify(document.querySelector('.charts').getBoundingClientRect())",
    "sample_rows": "document.querySelectorAll('#samples tr').length",
    "sample_text": "document.querySelector('#samples').innerText",
    "markup_in_samples": "document.querySelectorAll('#samples b').length",
    "config": "document.querySelector('#config').textContent",
    "external": "performance.getEntriesByType('resource').length",
}


def coloured_pixels(png: bytes, box: dict | None = None) -> int:
    """Pixels of a clear colour (the series' lines; text and grid are grey) in ``box``."""
    img = Image.open(io.BytesIO(png)).convert("RGB")
    if box:
        img = img.crop((int(box["left"]), int(box["top"]), int(box["right"]), int(box["bottom"])))
    return sum(img.convert("HSV").getchannel("S").histogram()[100:])  # saturation > 100/255


@pytest.fixture(scope="module")
def browser():
    if chromium.find_chromium() is None:
        pytest.fail("no Chromium: run scripts/setup.sh as root (apt-get install chromium)")
    return chromium


def test_the_browser_check_sees_console_errors_and_blocked_loads(browser, tmp_path):
    """The check below could not pass for want of looking: a page with a console error, an
    uncaught exception and an image its CSP blocks yields all three."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!doctype html><meta http-equiv='Content-Security-Policy' content=\"default-src 'none';"
        " script-src 'unsafe-inline'\"><img src='https://cdn.example.com/x.png'>"
        "<script>console.error('boom'); undefinedFunction();</script>"
    )
    page = browser.load(bad.as_uri())
    text = "\n".join(page.errors)
    assert "boom" in text and "undefinedFunction" in text, text
    assert "cdn.example.com" in text, text


def test_brorl_report_renders_in_headless_chromium(browser, run_dir, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "brorl.apps.cli", "report", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    page_path = Path(done.stdout.strip())
    assert page_path == run_dir / "report.html"
    page = browser.load(page_path.as_uri(), list(PAGE_CHECKS.values()))
    v = {name: page.values[expr] for name, expr in PAGE_CHECKS.items()}
    (tmp_path / "report.png").write_bytes(page.png)  # kept by pytest for a look at failures
    assert page.errors == [], page.errors
    assert v["external"] == 0  # loaded nothing: everything is inline
    assert (v["charts"], v["empty"]) == (len(report.CHARTS) + 1, 0)
    # every chart draws a line of real length (accuracy: eval/accuracy at 4 evaluations)
    assert v["drawn"] == len(report.CHARTS) + 1
    box = json.loads(v["chart_box"])
    coloured = coloured_pixels(page.png, box)
    assert coloured > 4000, f"only {coloured} coloured pixels where the charts are"
    assert v["sample_rows"] == 1 + 3 * (STEPS // EVERY)
    assert TRICKY in v["sample_text"] and v["markup_in_samples"] == 0
    assert "best" in v["sample_text"] and "worst" in v["sample_text"]
    assert "samples_every: 5" in v["config"] and "train_path: /data/train.jsonl" in v["config"]
