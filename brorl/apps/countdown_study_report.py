"""What ``brorl study countdown`` measures after its runs (``measure``: evaluations, pass@k and
the mechanism from each run's metrics.jsonl), and its tables and plots, written from
``results.json`` alone so they can be regenerated without rerunning the study:

    python -m brorl.apps.countdown_study_report docs/countdown/results.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from brorl.apps import plateau
from brorl.apps.recipe import mean_std
from brorl.apps.study_cmd import read_metrics

LABELS = ("easy", "medium", "hard")


def window(run: dict, sat: dict | None, budget: int) -> dict:
    """A run's update lines inside its window, with samples and seconds since the window began:
    since the plateau step P for the plateau phase (the saturation run's counters at P; a fork's
    clock starts when it resumed, the continuing run's at step P), since the start otherwise.
    The window ends at the last step within ``budget`` samples (the driver stops a run when it
    sees the budget reached, and the learner may have gone a few steps further)."""
    lines, t0 = read_metrics(Path(run["run_dir"]))
    start = {}
    if run["phase"] == "plateau":
        sat_lines, _ = read_metrics(Path(sat["run_dir"]))
        start = next(m for m in sat_lines if m["step"] == sat["step"])
        if run.get("continued"):
            t0 = start["time"]
        lines = [m for m in lines if m["step"] > sat["step"]]
    g0 = start.get("rollout/generated", 0.0)
    points = [
        {
            "step": m["step"],
            "version": int(m["learner/weight_version"]),
            "samples": m.get("rollout/generated", 0.0) - g0,
            "wall_s": m["time"] - t0,
        }
        for m in lines
    ]
    keep = max(1, sum(p["samples"] <= budget for p in points))  # samples only grow
    return {"lines": lines[:keep], "start": start, "points": points[:keep]}


def pick(points: list[dict], budget: int, k: int, wall_s: float) -> tuple[list[dict], dict]:
    """The ``k`` points nearest below evenly spaced sample counts (the last is the final one),
    and the last point within ``wall_s`` seconds (the first point when none is)."""
    chosen = []
    for i in range(1, k + 1):
        below = [p for p in points if p["samples"] <= budget * i / k]
        chosen.append(below[-1] if below else points[0])
    chosen[-1] = points[-1]
    in_time = [p for p in points if p["wall_s"] <= wall_s]
    return list({p["step"]: p for p in chosen}.values()), (in_time or points[:1])[-1]


def mechanism(win: dict) -> dict:
    """Per-label shares of the groups the run consumed in its window with a success and with
    all rewards equal (differences of the learner's cumulative counters), the probe mass change
    per update, the effective update ratio."""
    end, start = win["lines"][-1], win["start"]

    def delta(key):
        return end.get(key, 0.0) - start.get(key, 0.0)

    out: dict = {"success_share": {}, "all_equal_share": {}, "groups": {}}
    for label in LABELS:
        groups = delta(f"explore/groups/{label}")
        out["groups"][label] = groups
        out["success_share"][label] = (
            delta(f"explore/success_groups/{label}") / groups if groups else None
        )
        out["all_equal_share"][label] = (
            delta(f"explore/all_equal_groups/{label}") / groups if groups else None
        )
    total = sum(out["groups"].values())
    out["all_equal_share"]["all"] = (
        sum(delta(f"explore/all_equal_groups/{lb}") for lb in LABELS) / total if total else None
    )
    probed = [m["probe/mean_change"] for m in win["lines"] if "probe/mean_change" in m]
    out["probe_mean_change"] = statistics.fmean(probed) if probed else None
    out["probe_updates_lowering"] = statistics.fmean(d < 0 for d in probed) if probed else None
    eur = [m["explore/eur"] for m in win["lines"] if "explore/eur" in m]
    out["eur_mean"] = statistics.fmean(eur) if eur else None
    return out


def measure(cfg, inputs, sat: dict | None, runs: list[dict], evaluate) -> dict:
    """results.json of the study (``evaluate``: countdown_study.evaluate)."""
    wins = [window(r, sat, cfg.sample_budget) for r in runs]
    for r, w in zip(runs, wins):
        last = w["points"][-1]
        r.update(steps=last["step"], generated=last["samples"], wall_s=last["wall_s"])
    equal_wall = {
        ph: min(r["wall_s"] for r in runs if r["phase"] == ph) for ph in {r["phase"] for r in runs}
    }
    picks = [
        pick(w["points"], cfg.sample_budget, cfg.eval_points, equal_wall[r["phase"]])
        for r, w in zip(runs, wins)
    ]

    def vdir(run, point):
        return Path(run["run_dir"]) / "weights" / f"v{point['version']:08d}"

    dirs = {vdir(r, p) for r, (curve, at_wall) in zip(runs, picks) for p in [*curve, at_wall]}
    accs = evaluate(cfg, inputs.model, sorted(dirs))
    plateau_dir = None
    if sat is not None:
        start = wins[0]["start"]
        plateau_dir = (
            Path(sat["run_dir"]) / "weights" / f"v{int(start['learner/weight_version']):08d}"
        )
    finals = [vdir(r, w["points"][-1]) for r, w in zip(runs, wins)]
    passk = evaluate(
        cfg,
        inputs.model,
        [inputs.model, *([plateau_dir] if plateau_dir else []), *finals],
        passk=True,
    )
    rows = []
    for r, w, (curve, at_wall), final in zip(runs, wins, picks, finals):

        def acc(p):
            got = accs[str(vdir(r, p))]
            return {"accuracy": got["accuracy"], "by_label": got["by_label"]}

        rows.append(
            {
                **{k: v for k, v in r.items() if k not in ("run_dir", "budget")},
                "curve": [{**p, **acc(p)} for p in curve],
                "equal_wall": {"wall_s": equal_wall[r["phase"]], **at_wall, **acc(at_wall)},
                "pass_at_k": passk[str(final)]["pass_at_k"]["pass_at_k"],
                **mechanism(w),
            }
        )
    report = {
        "config": cfg.model_dump(),
        "warmstart": {
            "accuracy": inputs.accuracy,
            "by_label": inputs.by_stratum,
            "pass_at_k": passk[str(inputs.model)]["pass_at_k"]["pass_at_k"],
        },
        "runs": rows,
    }
    if sat is not None:
        report["saturation"] = {
            **{k: v for k, v in sat.items() if k != "run_dir"},
            "pass_at_k": passk[str(plateau_dir)]["pass_at_k"]["pass_at_k"],
        }
    return report


def groups(report: dict) -> list[tuple[str, str, list[dict]]]:
    """(phase, arm label, its runs over seeds), in the order the runs were made."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in report["runs"]:
        out.setdefault((r["phase"], r["label"]), []).append(r)
    return [(phase, label, rows) for (phase, label), rows in out.items()]


def agg(values, digits: int = 3) -> str:
    """mean ± population std over seeds ("-" when nothing was measured)."""
    return mean_std([v for v in values if v is not None], digits)


def _label_cells(rows, get) -> str:
    return " | ".join(agg(get(r).get(lb) for r in rows) for lb in LABELS)


def write_tables(report: dict, path: Path) -> None:
    cfg, ws = report["config"], report["warmstart"]
    lines = [
        f"Seeds {cfg['seeds']} (mean ± std over them); sample budget "
        f"{cfg['sample_budget']} paths per arm; {cfg['eval_problems']} held-out problems, "
        "greedy.",
        "",
    ]
    sat = report.get("saturation")
    if sat:
        after = [p["accuracy"] for r in report["runs"] if r.get("continued") for p in r["curve"]]
        before = [ws["accuracy"]] + [p["accuracy"] for p in sat["curve"]]  # ends at P
        rise = plateau.rise_after(before, after) if after else None
        held = "-" if rise is None else "yes" if rise <= cfg["plateau_min_gain"] else "**no**"
        lines += [
            "### Saturation (N = %d)" % cfg["small_n"],
            "",
            "| warm-start | evaluations | plateau reached | began at step | P (forked) | "
            "accuracy at P | narrow arm after P (each evaluation) | best after − best to P | "
            f"held (≤ {cfg['plateau_min_gain']}) |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {ws['accuracy']:.3f} | {len(sat['curve'])} | "
            f"{'yes' if sat['plateau_reached'] else 'no'} | {sat['plateau_start_step']} | "
            f"{sat['step']} | {sat['accuracy']:.3f} | {', '.join(f'{a:.3f}' for a in after)} | "
            f"{'-' if rise is None else f'{rise:+.3f}'} | {held} |",
            "",
            "Saturation curve (step: accuracy): "
            + ", ".join(f"{p['step']}: {p['accuracy']:.3f}" for p in sat["curve"]),
            "",
        ]
    for phase in ("plateau", "warmstart"):
        mine = [g for g in groups(report) if g[0] == phase]
        if not mine:
            continue
        title = (
            "From the plateau (step P's checkpoint)"
            if phase == "plateau"
            else "From the warm-start"
        )
        lines += [
            f"### {title}",
            "",
            "| arm | steps | generated | wall s | acc, equal samples | easy | medium | hard | "
            "acc, equal wall | hard success share | all-equal groups | probe Δ log-prob | "
            "updates lowering probes |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for _, label, rows in mine:
            lines.append(
                f"| {label} | {agg([r['steps'] for r in rows], 0)} | "
                f"{agg([r['generated'] for r in rows], 0)} | "
                f"{agg([r['wall_s'] for r in rows], 0)} | "
                f"{agg(r['curve'][-1]['accuracy'] for r in rows)} | "
                f"{_label_cells(rows, lambda r: r['curve'][-1]['by_label'])} | "
                f"{agg(r['equal_wall']['accuracy'] for r in rows)} | "
                f"{agg(r['success_share']['hard'] for r in rows)} | "
                f"{agg(r['all_equal_share']['all'] for r in rows)} | "
                f"{agg([r['probe_mean_change'] for r in rows], 4)} | "
                f"{agg(r['probe_updates_lowering'] for r in rows)} |"
            )
        wall = mine[0][2][0]["equal_wall"]["wall_s"]
        lines += ["", f"Equal wall-clock: {wall:.0f} s (the phase's shortest arm).", ""]
    lines += [
        "### Share of groups with at least one success, per label",
        "",
        "| phase | arm | easy | medium | hard |",
        "|---|---|---|---|---|",
    ]
    for phase, label, rows in groups(report):
        lines.append(f"| {phase} | {label} | {_label_cells(rows, lambda r: r['success_share'])} |")
    ks = list(ws["pass_at_k"])
    lines += [
        "",
        f"### Hard held-out pass@k ({cfg['passk_problems']} problems, "
        f"{cfg['passk_samples']} samples each, temperature 1)",
        "",
        "| policy | " + " | ".join(f"k={k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
        "| warm-start | " + " | ".join(f"{ws['pass_at_k'][k]:.3f}" for k in ks) + " |",
    ]
    if sat:
        lines.append(
            "| plateau (P) | " + " | ".join(f"{sat['pass_at_k'][k]:.3f}" for k in ks) + " |"
        )
    for phase, label, rows in groups(report):
        lines.append(
            f"| {phase}: {label} | "
            + " | ".join(agg(r["pass_at_k"][k] for r in rows) for k in ks)
            + " |"
        )
    path.write_text("\n".join(lines) + "\n")


def mean_curve(rows: list[dict], x_key: str) -> tuple[list[float], list[float]]:
    k = min(len(r["curve"]) for r in rows)
    xs = [statistics.fmean(r["curve"][i][x_key] for r in rows) for i in range(k)]
    return xs, [statistics.fmean(r["curve"][i]["accuracy"] for r in rows) for i in range(k)]


def write_plots(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sat, ws = report.get("saturation"), report["warmstart"]
    if sat:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(
            [0] + [p["step"] for p in sat["curve"]],
            [ws["accuracy"]] + [p["accuracy"] for p in sat["curve"]],
            "o-",
            label="saturation",
        )
        for r in report["runs"]:
            if r.get("continued"):
                ax.plot(
                    [p["step"] for p in r["curve"]],
                    [p["accuracy"] for p in r["curve"]],
                    "s--",
                    label="narrow arm after P (same run)",
                )
        ax.axvline(sat["step"], ls=":", c="gray", label="P (plateau, forked)")
        ax.set_xlabel(f"learner steps (N={report['config']['small_n']})")
        ax.set_ylabel("held-out greedy accuracy")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "study_saturation.png", dpi=100)
        plt.close(fig)
    for phase in ("plateau", "warmstart"):
        mine = [g for g in groups(report) if g[0] == phase]
        if not mine:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        base = sat["accuracy"] if phase == "plateau" else ws["accuracy"]
        for ax, (x_key, xlabel) in zip(
            axes, (("samples", "paths generated"), ("wall_s", "seconds"))
        ):
            for _, label, rows in mine:
                xs, ys = mean_curve(rows, x_key)
                ax.plot([0] + xs, [base] + ys, marker="o", label=label)
            ax.set_xlabel(f"{xlabel} since the {'plateau' if phase == 'plateau' else 'warm-start'}")
        axes[0].set_ylabel("held-out greedy accuracy (mean over seeds)")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"study_accuracy_{phase}.png", dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [int(k) for k in ws["pass_at_k"]]
    ax.plot(ks, list(ws["pass_at_k"].values()), "k--", marker="o", label="warm-start")
    for phase, label, rows in groups(report):
        ax.plot(
            ks,
            [statistics.fmean(r["pass_at_k"][str(k)] for r in rows) for k in ks],
            marker="o",
            label=f"{phase}: {label}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("hard held-out pass@k")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "study_pass_at_k.png", dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    """Rewrite tables.md and the plots beside a results.json."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_file():
        print("usage: python -m brorl.apps.countdown_study_report RESULTS_JSON", file=sys.stderr)
        return 2
    path = Path(args[0])
    report = json.loads(path.read_text())
    write_tables(report, path.parent / "tables.md")
    write_plots(report, path.parent)
    print(f"wrote {path.parent}/tables.md and the plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
