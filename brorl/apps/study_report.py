"""The tables and plots of ``brorl study broaden`` (docs/broadening.md), from its results.json
report alone, so they can be regenerated without rerunning the study."""

from __future__ import annotations

import statistics
from pathlib import Path

COLUMNS = [
    ("accuracy_final", "held-out acc (final)"),
    ("gain", "gain over plateau"),
    ("eur_mean", "EUR"),
    ("reward_entropy_mean", "reward entropy"),
    ("mixed_groups_mean", "mixed groups"),
    ("probe_fell_fraction_mean", "probes fell (fraction)"),
    ("probe_mean_change_mean", "probe Δ log-prob"),
    ("probe_updates_lowering", "updates lowering probe mass"),
]


def groups(report: dict) -> list[tuple[str, str, list[dict]]]:
    """(regime, label, runs over seeds) in the order the runs were made."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in report["runs"]:
        out.setdefault((r["regime"], r["label"]), []).append(r)
    return [(regime, label, rows) for (regime, label), rows in out.items()]


def agg(values) -> str:
    """mean ± population std over seeds ("-" when nothing was measured)."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mean = statistics.fmean(values)
    return f"{mean:.3f} ± {statistics.pstdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"


def write_tables(report: dict, path: Path) -> None:
    sat = report["saturation"]
    plateau_acc = sat["accuracy"]
    ks = list(sat["pass_at_k"])
    lines = [
        "### Saturation",
        "",
        "| warm-start acc | evaluations | plateau reached | plateau began at step | "
        "continued from step | accuracy there |",
        "|---|---|---|---|---|---|",
        f"| {report['warmstart_accuracy']:.3f} | {len(sat['curve'])} | "
        f"{'yes' if sat['plateau_reached'] else 'no'} | {sat['plateau_start_step']} | "
        f"{sat['step']} | {plateau_acc:.3f} |",
        "",
        "### Continuation from the plateau policy",
        "",
        f"Mean ± std over seeds {report['config']['seeds']}; gain = final held-out accuracy − "
        f"{plateau_acc:.3f} (the plateau policy's).",
        "",
        "| regime | arm | steps | generated | wall s | "
        + " | ".join(name for _, name in COLUMNS)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for regime, label, rows in groups(report):
        for r in rows:
            r["gain"] = r["accuracy_final"] - plateau_acc
        lines.append(
            f"| {regime} | {label} | {agg(r['steps'] for r in rows)} | "
            f"{agg(r['generated'] for r in rows)} | {agg(r['wall_s'] for r in rows)} | "
            + " | ".join(agg(r[key] for r in rows) for key, _ in COLUMNS)
            + " |"
        )
    lines += [
        "",
        f"### pass@k (held-out, {report['config']['passk_samples']} samples per problem, "
        "temperature 1)",
        "",
        "| policy | " + " | ".join(f"k={k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
        "| plateau | " + " | ".join(f"{sat['pass_at_k'][k]:.3f}" for k in ks) + " |",
    ]
    for regime, label, rows in groups(report):
        cells = " | ".join(agg(r["pass_at_k"][k] for r in rows) for k in ks)
        lines.append(f"| {regime}: {label} | {cells} |")
    path.write_text("\n".join(lines) + "\n")


def mean_curve(rows: list[dict], x_key: str) -> tuple[list[float], list[float]]:
    """Point i of every seed's curve, averaged (seeds may stop at different steps)."""
    k = min(len(r["curve"]) for r in rows)
    xs = [statistics.fmean(r["curve"][i][x_key] for r in rows) for i in range(k)]
    ys = [statistics.fmean(r["curve"][i]["accuracy"] for r in rows) for i in range(k)]
    return xs, ys


def write_plots(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sat = report["saturation"]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [0] + [p["step"] for p in sat["curve"]]
    ax.plot(xs, [report["warmstart_accuracy"]] + [p["accuracy"] for p in sat["curve"]], "o-")
    if sat["plateau_start_step"] is not None:
        ax.axvline(sat["plateau_start_step"], ls="--", c="gray", label="plateau began")
        ax.legend()
    ax.set_xlabel(f"learner steps (N={report['config']['small_n']})")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("saturation phase")
    fig.tight_layout()
    fig.savefig(out / "saturation.png", dpi=100)
    plt.close(fig)

    for regime, x_key, xlabel in (
        ("equal_samples", "samples", "paths generated since the plateau"),
        ("equal_wall", "wall_s", "seconds since the plateau"),
        ("budget", "samples", "paths generated since the plateau"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for reg, label, rows in groups(report):
            if reg == regime:
                xs, ys = mean_curve(rows, x_key)
                ax.plot([0] + xs, [sat["accuracy"]] + ys, marker="o", label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out greedy accuracy")
        ax.set_title(f"{regime.replace('_', ' ')} (mean over seeds)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"accuracy_{regime}.png", dpi=100)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [int(k) for k in sat["pass_at_k"]]
    ax.plot(ks, list(sat["pass_at_k"].values()), "k--", marker="o", label="plateau")
    for regime, label, rows in groups(report):
        if regime == "equal_samples":
            ys = [statistics.fmean(r["pass_at_k"][str(k)] for r in rows) for k in ks]
            ax.plot(ks, ys, marker="o", label=f"{label} (equal samples)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (held-out)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pass_at_k.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    names, fell, change = [], [], []
    for regime, label, rows in groups(report):
        names.append(f"{regime}\n{label}")
        fell.append(statistics.fmean(r["probe_fell_fraction_mean"] or 0.0 for r in rows))
        change.append(statistics.fmean(r["probe_mean_change_mean"] or 0.0 for r in rows))
    bars = ax.bar(range(len(names)), fell)
    for bar, d in zip(bars, change):  # the mean change of the answer log-prob, on each bar
        ax.annotate(
            f"Δ {d:+.3f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.set_xticks(range(len(names)), names, fontsize=7)
    ax.set_ylabel("probes whose answer mass fell")
    ax.set_title("per update, mean over updates and seeds (Δ: mean log-prob change)")
    ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(out / "probe_mass.png", dpi=100)
    plt.close(fig)
