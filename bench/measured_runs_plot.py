#!/usr/bin/env python3
"""Predicted vs measured iteration time (and peak memory) of the published
runs in bench/published-runs/, per framework preset, before and after the
calibration round trip.

Input: bench/results/measured_runs.csv, written by
bench/published-runs/compare_runs.py (columns: file, label, split, preset, phase,
fitted_on, measured_s, predicted_s, measured_gib, predicted_gib).
and measured_runs_choices.csv (the compute-scale fit on every choice of one
or two runs of a cluster). Output: bench/results/measured_runs.png.

    /usr/bin/python3 bench/measured_runs_plot.py [--csv CSV] [--out PNG]
"""
import argparse
import csv
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = ["megatron-core", "megatron-deepspeed", "deepspeed-zero1", "fsdp",
           "arachne-reference"]
MARKERS = {"megatron-lm-2021.yaml": "o", "bloom-176b.yaml": "*",
           "llm-foundry-mpt.yaml": ".", "torchtitan-llama3-8b.yaml": "s",
           "dlperf-v100.yaml": "^"}


def read(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            for k in ("measured_s", "predicted_s", "measured_gib", "predicted_gib"):
                r[k] = float(r[k]) if r.get(k) not in (None, "") else None
            rows.append(r)
    return rows


def scatter(ax, rows, key_m, key_p, title, unit):
    lo, hi = math.inf, 0
    for fname, marker in MARKERS.items():
        pts = [(r[key_m], r[key_p]) for r in rows
               if r["file"] == fname and r[key_m] and r[key_p]]
        if not pts:
            continue
        xs, ys = zip(*pts)
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        ax.scatter(xs, ys, marker=marker, s=18 if marker != "." else 30,
                   label=fname.replace(".yaml", ""), alpha=0.75)
    if hi == 0:
        ax.set_visible(False)
        return
    lo, hi = lo / 1.5, hi * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.9, 1.1):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured {unit}")
    ax.set_ylabel(f"predicted {unit}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper left")


def choices(ax, path):
    """Per cluster, the share of held-out runs within 10% after a
    compute-scale fit on each pair of its runs (one box per cluster)."""
    if not os.path.exists(path):
        ax.set_visible(False)
        return
    by = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["fit_runs"] == "2":
                by.setdefault(r["cluster"], []).append(
                    100.0 * int(r["within_10pct"]) / int(r["held_out"]))
    if not by:
        ax.set_visible(False)
        return
    names = list(by)
    ax.boxplot([by[n] for n in names], labels=[f"{n}\n({len(by[n])} pairs)" for n in names],
               showfliers=True)
    ax.set_ylim(-5, 105)
    ax.set_ylabel("held-out runs within 10% (%)")
    ax.set_title("compute-scale fit on every pair of a cluster's runs", fontsize=9)
    ax.tick_params(axis="x", labelsize=6, rotation=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default=os.path.join(HERE, "results", "measured_runs.csv"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "measured_runs.png"))
    a = ap.parse_args()
    rows = read(a.csv)
    own = [r for r in rows if r["phase"] == "own-preset"]
    after = [r for r in rows if r["phase"] == "after-fit-scale-only" and r["fitted_on"] == "held-out"
             and r["preset"] == "own"]
    fig, axes = plt.subplots(3, 3, figsize=(15, 14))
    scatter(axes[0][0], own, "measured_s", "predicted_s",
            "iteration time, own preset, uncalibrated", "s")
    scatter(axes[0][1], after, "measured_s", "predicted_s",
            "iteration time, held-out runs after the per-cluster fit (compute_scale only)", "s")
    scatter(axes[0][2], own, "measured_gib", "predicted_gib",
            "peak memory per GPU, own preset", "GiB")
    # Every preset on every run: the ratio predicted / measured.
    for i, phase in enumerate(("own-preset",)):
        ax = axes[1][0]
        data, labels = [], []
        for p in PRESETS:
            v = [r["predicted_s"] / r["measured_s"] for r in rows
                 if r["phase"] == "all-presets" and r["preset"] == p
                 and r["predicted_s"] and r["measured_s"]]
            if v:
                data.append(v)
                labels.append(p)
        if data:
            ax.boxplot(data, labels=labels, showfliers=True)
            ax.set_yscale("log")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_ylabel("predicted / measured iteration time")
            ax.set_title("every run under every preset (uncalibrated)", fontsize=9)
            ax.tick_params(axis="x", labelsize=7, rotation=20)
    for fname, ax in zip(("llm-foundry-mpt.yaml", "megatron-lm-2021.yaml"), (axes[1][1], axes[1][2])):
        def pts(phase):
            return [(r["measured_s"], r["predicted_s"] / r["measured_s"]) for r in rows
                    if r["file"] == fname and r["phase"] == phase and r["predicted_s"]
                    and r.get("preset") == "own"
                    and (phase == "own-preset" or r["fitted_on"] == "held-out")]
        for phase, marker, label in (("own-preset", "o", "own preset, uncalibrated"),
                                     ("after-fit-scale-only", "x", "held out, fit compute_scale"),
                                     ("after-fit", "+", "held out, fit auto (+ fixed costs)")):
            p = pts(phase)
            if p:
                ax.scatter(*zip(*p), s=16, marker=marker, label=label, alpha=0.7)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhspan(0.9, 1.1, color="g", alpha=0.08)
        ax.set_xscale("log")
        ax.set_xlabel("measured iteration time (s)")
        ax.set_ylabel("predicted / measured")
        ax.set_title(fname.replace(".yaml", "") + ": before / after the per-cluster fit", fontsize=9)
        ax.legend(fontsize=7)
    choices(axes[2][0], os.path.join(os.path.dirname(a.csv), "measured_runs_choices.csv"))
    axes[2][1].set_visible(False)
    axes[2][2].set_visible(False)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
