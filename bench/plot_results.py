#!/usr/bin/env python3
"""Draws the PNG plots of an `arachne bench` run from its CSV files.

    python3 bench/plot_results.py DIR

reads DIR/results.csv (and DIR/progress.csv, DIR/fig4_samples.csv,
DIR/learned_policies.csv when present) and writes into DIR, one file per scenario:

  <scenario>.png          grouped bars: throughput of each planner's plan per
                          composition, planning time printed on each bar
                          (Figures 1, 7, 9, 10 and the testbed, Figure 8)
  <scenario>-curve.png    best-so-far throughput against plan evaluations
                          and against planning time, log x (Figure 11;
                          search_curve scenarios). The learned planner's
                          curve counts planning time only; a dashed copy
                          shifted by its policy's offline training (rollouts
                          and seconds, from DIR/learned_policies.csv) shows
                          what it cost before planning.
  <scenario>-scatter.png  random plan structures vs each planner's plan,
                          relative throughput against pipeline depth
                          (Figure 4; scatter scenarios)

Needs only python3 and matplotlib (Debian: python3-matplotlib).
"""

import collections
import csv
import os
import random
import sys

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

# Fixed colours so a planner looks the same in every figure.
PLANNER_COLORS = {
    "exact": "#d62728",
    "amp": "#1f77b4",
    "espresso": "#ff7f0e",
    "hexiscale": "#2ca02c",
    "metis": "#9467bd",
    "sailor": "#8c564b",
    "random": "#7f7f7f",
    "learned": "#e377c2",
}
FALLBACK_COLORS = ["#bcbd22", "#17becf", "#393b79", "#637939", "#843c39"]


def planner_color(name, order):
    if name in PLANNER_COLORS:
        return PLANNER_COLORS[name]
    return FALLBACK_COLORS[order.index(name) % len(FALLBACK_COLORS)]


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def short_time(seconds):
    """Planning time as the paper prints it above bars: <1s, 3s, 600s."""
    if seconds < 1:
        return "<1s"
    return "%.0fs" % seconds


def panel_title(figure):
    """"7a" -> "Figure 7(a)", "11" -> "Figure 11", like the paper's captions."""
    digits = len(figure) - len(figure.lstrip("0123456789"))
    if digits == 0:
        return figure
    if digits == len(figure):
        return "Figure " + figure
    return "Figure %s(%s)" % (figure[:digits], figure[digits:])


def ordered_unique(values):
    return list(collections.OrderedDict.fromkeys(values))


def plot_bars(scenario, rows, planners, out_dir):
    compositions = ordered_unique(r["composition"] for r in rows)
    by_key = {(r["composition"], r["planner"]): r for r in rows}
    n = len(planners)
    width = 0.8 / max(n, 1)
    fig_w = max(6.0, 1.2 + len(compositions) * (0.35 * n + 0.6))
    fig, ax = plt.subplots(figsize=(fig_w, 4.2))
    top = max([float(r["throughput_iters_per_s"]) for r in rows
               if r["status"] == "ok"] or [1.0])
    for pi, planner in enumerate(planners):
        xs, heights = [], []
        for ci, comp in enumerate(compositions):
            r = by_key.get((comp, planner))
            if r is None:
                continue
            x = ci - 0.4 + width * (pi + 0.5)
            ok = r["status"] == "ok"
            h = float(r["throughput_iters_per_s"]) if ok else 0.0
            xs.append(x)
            heights.append(h)
            label = short_time(float(r["planning_time_s"]))
            if not ok:
                label = "no plan" if r["status"] == "no_plan" else "error"
            ax.text(x, h + top * 0.01, label, ha="center", va="bottom",
                    rotation=90, fontsize=6.5)
        ax.bar(xs, heights, width, label=planner,
               color=planner_color(planner, planners), edgecolor="black",
               linewidth=0.4)
    ax.set_xticks(range(len(compositions)))
    ax.set_xticklabels(compositions, fontsize=8)
    ax.set_ylabel("Throughput (iter/s)")
    ax.set_ylim(0, top * 1.35)
    first = rows[0]
    ax.set_title("%s: %s (%s)" % (panel_title(first["figure"]),
                                  first["model"], scenario), fontsize=10)
    ax.legend(ncol=min(n, 7), fontsize=7, loc="upper left", frameon=False)
    ax.grid(axis="y", linewidth=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, scenario + ".png")
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def training_label(policy):
    """'offline training: 89,504 rollouts (1 plan each), 2,694 s, 2 runs'."""
    runs = int(policy["training_runs"])
    return "offline training: %s rollouts (1 plan each), %s s%s" % (
        "{:,}".format(int(policy["training_rollouts"])),
        "{:,.0f}".format(float(policy["training_wall_s"])),
        ", %d runs" % runs if runs > 1 else "")


def plot_curve(scenario, rows, planners, out_dir, policy=None):
    """Two panels: best-so-far throughput against plans scored, and against
    planning time. Every solid curve counts what its planner spent at
    planning time. The learned planner also spent effort before: its policy
    was trained offline on other compositions. `policy` (a row of
    learned_policies.csv, or None) shifts a dashed copy of its curve by the
    training's rollouts (each built and scored one candidate plan; auto-fill
    may price a feasible one several times, so this is not an evaluation
    count) and seconds, so the two are never mixed up."""
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 5.0))
    ax_e, ax_t = axes
    most_e, least_t, most_t = 1e5, 1.0, 1.0
    for planner in planners:
        pts = [(int(r["evaluations"]), float(r["wall_s"]),
                float(r["best_throughput_iters_per_s"]))
               for r in rows if r["planner"] == planner]
        if not pts:
            continue
        pts.sort()
        color = planner_color(planner, planners)
        es = [max(1, e) for e, _, _ in pts]
        ts = [max(1e-3, t) for _, t, _ in pts]
        ys = [y for _, _, y in pts]
        label = planner
        if planner == "learned":
            label = "learned (planning time only)"
        ax_e.step(es, ys, where="post", label=label, color=color,
                  linewidth=1.4)
        ax_t.step(ts, ys, where="post", label=label, color=color,
                  linewidth=1.4)
        most_e = max(most_e, es[-1])
        least_t = min(least_t, ts[0])
        most_t = max(most_t, ts[-1])
        if planner == "learned" and policy is not None:
            rollouts = int(policy["training_rollouts"])
            seconds = float(policy["training_wall_s"])
            shifted = "learned incl. " + training_label(policy)
            ax_e.step([e + rollouts for e in es], ys, where="post",
                      label=shifted, color=color, linewidth=1.4,
                      linestyle="--")
            ax_t.step([t + seconds for t in ts], ys, where="post",
                      label=shifted, color=color, linewidth=1.4,
                      linestyle="--")
            # A bracket over the training itself, so the gap before the
            # dashed curve reads as the policy's cost, not a slow search.
            for ax, end, text in (
                    (ax_e, rollouts, "{:,} training rollouts".format(rollouts)),
                    (ax_t, seconds, "{:,.0f} s of training".format(seconds))):
                ax.axvline(end, color=color, linewidth=0.6, linestyle=":")
                ax.annotate("", xy=(end, 1.02), xycoords=("data", "axes fraction"),
                            xytext=(0, 1.02),
                            textcoords=("axes fraction", "axes fraction"),
                            arrowprops=dict(arrowstyle="<->", color=color,
                                            linewidth=0.8),
                            annotation_clip=False)
                ax.annotate("learned policy, offline: " + text,
                            xy=(0.5, 1.035), xycoords="axes fraction",
                            ha="center", va="bottom", fontsize=7, color=color)
            most_e = max(most_e, es[-1] + rollouts)
            most_t = max(most_t, ts[-1] + seconds)
    ax_e.set_xscale("log")
    ax_e.set_xlim(1, most_e * 1.5)
    ax_e.set_xlabel("Candidate plans scored (plan evaluations)")
    ax_t.set_xscale("log")
    ax_t.set_xlim(least_t * 0.8, most_t * 1.5)
    ax_t.set_xlabel("Planning time (s)")
    for ax in axes:
        ax.set_ylabel("Best-so-far throughput (iter/s)")
        ax.grid(linewidth=0.3)
    handles, labels = ax_e.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, frameon=False, loc="lower center",
               ncol=min(len(labels), 5))
    fig.suptitle("%s: %s (%s)" % (panel_title(rows[0]["figure"]),
                                  rows[0]["composition"], scenario),
                 fontsize=10)
    # Room below for the legend's rows.
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) - 1) // 5), 1, 1))
    path = os.path.join(out_dir, scenario + "-curve.png")
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def plot_scatter(scenario, samples, rows, planners, out_dir, suffix=""):
    ok_rows = [r for r in rows if r["status"] == "ok"]
    best = max([float(s["throughput_iters_per_s"]) for s in samples] +
               [float(r["throughput_iters_per_s"]) for r in ok_rows] + [1e-12])
    rng = random.Random(0)  # fixed jitter: the same data draws the same plot
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.scatter([int(s["max_depth"]) + rng.uniform(-0.3, 0.3) for s in samples],
               [float(s["throughput_iters_per_s"]) / best for s in samples],
               s=3, color="#b0b0b0", alpha=0.35, linewidths=0,
               label="random structures (%d)" % len(samples))
    markers = "o^sDvP*Xh"
    for i, r in enumerate(ok_rows):
        ax.scatter([int(r["max_depth"])],
                   [float(r["throughput_iters_per_s"]) / best],
                   s=70, marker=markers[i % len(markers)],
                   color=planner_color(r["planner"], planners),
                   edgecolor="black", linewidth=0.6, zorder=3,
                   label=r["planner"])
    ax.set_xlabel("Pipeline depth (deepest template)")
    ax.set_ylabel("Relative throughput")
    ax.set_ylim(0, 1.05)
    ax.set_title("%s: %s, %s (%s)" % (panel_title(rows[0]["figure"]),
                                      rows[0]["model"],
                                      rows[0]["composition"], scenario),
                 fontsize=10)
    ax.grid(linewidth=0.3)
    ax.legend(fontsize=7, frameon=False, loc="upper right")
    fig.tight_layout()
    path = os.path.join(out_dir, scenario + "-scatter" + suffix + ".png")
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def plot_growth(scenario, rows, planners, out_dir, minutes_per_step=5):
    """Figure 8's view of a growing cluster: each planner's throughput over
    time as nodes join (one join every `minutes_per_step` minutes, every
    planner replanning from scratch), so a plan slower than the one it
    replaces shows as a drop."""
    compositions = ordered_unique(r["composition"] for r in rows)
    by_key = {(r["composition"], r["planner"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    end = len(compositions) * minutes_per_step
    for planner in planners:
        xs, ys = [], []
        for ci, comp in enumerate(compositions):
            r = by_key.get((comp, planner))
            ok = r is not None and r["status"] == "ok"
            xs.append(ci * minutes_per_step)
            ys.append(float(r["throughput_iters_per_s"]) if ok else 0.0)
        xs.append(end)
        ys.append(ys[-1])
        ax.step(xs, ys, where="post", label=planner,
                color=planner_color(planner, planners), linewidth=1.5)
    top = max([float(r["throughput_iters_per_s"]) for r in rows
               if r["status"] == "ok"] or [1.0])
    for ci, comp in enumerate(compositions):
        ax.axvline(ci * minutes_per_step, color="grey", linewidth=0.3)
        ax.text(ci * minutes_per_step + 0.15, top * 1.28, comp, fontsize=6.5,
                va="top", color="dimgrey")
    ax.set_xlim(0, end)
    ax.set_ylim(0, top * 1.3)
    ax.set_xlabel("Time (min): a node joins every %d min" % minutes_per_step)
    ax.set_ylabel("Throughput (iter/s)")
    ax.set_title("%s over time: %s (%s)" % (panel_title(rows[0]["figure"]),
                                            rows[0]["model"], scenario),
                 fontsize=10)
    ax.grid(linewidth=0.3)
    ax.legend(fontsize=7, frameon=False, loc="lower right", ncol=4)
    fig.tight_layout()
    path = os.path.join(out_dir, scenario + "-timeline.png")
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: %s DIR (the --out of arachne bench)\n" % argv[0])
        return 2
    out_dir = argv[1]
    results = read_csv(os.path.join(out_dir, "results.csv"))
    if not results:
        sys.stderr.write("plot_results: no rows in %s/results.csv\n" % out_dir)
        return 1
    progress = read_csv(os.path.join(out_dir, "progress.csv"))
    samples = read_csv(os.path.join(out_dir, "fig4_samples.csv"))
    policies = {p["model"]: p for p in
                read_csv(os.path.join(out_dir, "learned_policies.csv"))}
    planners = ordered_unique(r["planner"] for r in results)
    written = []
    for scenario in ordered_unique(r["scenario"] for r in results):
        rows = [r for r in results if r["scenario"] == scenario]
        written.append(plot_bars(scenario, rows, planners, out_dir))
        kind = rows[0]["kind"]
        if kind == "growth":
            written.append(plot_growth(scenario, rows, planners, out_dir))
        if kind == "search_curve":
            curve = [p for p in progress if p["scenario"] == scenario]
            if curve:
                written.append(plot_curve(scenario, curve, planners, out_dir,
                                          policies.get(rows[0]["model"])))
        if kind == "scatter":
            comps = ordered_unique(r["composition"] for r in rows)
            for ci, comp in enumerate(comps):
                pts = [s for s in samples if s["scenario"] == scenario and
                       s["composition"] == comp]
                comp_rows = [r for r in rows if r["composition"] == comp]
                suffix = "-%d" % (ci + 1) if len(comps) > 1 else ""
                written.append(plot_scatter(scenario, pts, comp_rows, planners,
                                            out_dir, suffix))
    sys.stderr.write("plot_results: wrote %d plots in %s\n" %
                     (len(written), out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
