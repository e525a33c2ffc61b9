#!/usr/bin/env python3
"""Draws the training curve of a learned policy (`arachne train`).

    python3 bench/plot_training_curve.py CURVE.csv [MORE.csv ...] \\
        [--out FILE.png] [--title TEXT]

CURVE.csv is the curve `arachne train` writes next to a checkpoint
(<out>.curve.csv: iteration, episodes, elapsed_s, mean_reward, best_reward,
greedy_reward, forced_probability, loss). Several files are runs of one
policy in training order (a later run continued the earlier one with
--init): their episodes and seconds are laid end to end and a dotted line
marks where each run starts.

The plot: normalised return (throughput of the plan / the composition's
compute bound; a negative value is an infeasible first template) against
rollouts (episodes), with wall time of training on the top axis:
  mean     the iteration's mean sampled return (thin) and its moving
           average over ~2% of the iterations (bold)
  best     the best single return seen so far
  greedy   the greedy policy's mean return on the iteration's compositions
Writes FILE.png (default: the last CSV with .csv replaced by .png).

Needs only python3 and matplotlib (Debian: python3-matplotlib); exits 3
with a message when matplotlib is missing, 2 on bad input.
"""

import argparse
import bisect
import csv
import os
import sys

COLUMNS = ("episodes", "elapsed_s", "mean_reward", "best_reward",
           "greedy_reward")


def read_curve(path):
    """The rows of one curve as dicts of floats; ValueError naming the file
    and the problem on bad input."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError("%s: missing column(s) %s" %
                             (path, ", ".join(missing)))
        rows = []
        for line, r in enumerate(reader, start=2):
            try:
                rows.append({c: float(r[c]) for c in COLUMNS})
            except (TypeError, ValueError):
                raise ValueError("%s:%d: not a number in %s" %
                                 (path, line, ", ".join(COLUMNS)))
    if not rows:
        raise ValueError("%s: no rows" % path)
    return rows


def chain(curves):
    """Lays the runs end to end: each run's episodes and seconds continue
    from the previous run's last row. Returns the joined rows and the
    episode at which each run after the first starts."""
    joined, starts = [], []
    episode_offset, time_offset = 0.0, 0.0
    for i, rows in enumerate(curves):
        if i > 0:
            starts.append(episode_offset)
        for r in rows:
            r = dict(r)
            r["episodes"] += episode_offset
            r["elapsed_s"] += time_offset
            joined.append(r)
        episode_offset = joined[-1]["episodes"]
        time_offset = joined[-1]["elapsed_s"]
    return joined, starts


def moving_average(values, window):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def interpolate(xs, ys):
    """Piecewise-linear map xs -> ys (both increasing), extended past the
    ends along the first and last segments (so a tick beyond the data, say
    3000 s after a 2694 s run, lands off the axis instead of at its edge);
    for the wall-time axis over episodes."""
    def f(values):
        result = []
        for v in values:
            j = min(max(bisect.bisect_left(xs, v), 1), len(xs) - 1)
            x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
            result.append(y0 if x1 == x0 else
                          y0 + (y1 - y0) * (v - x0) / (x1 - x0))
        return result
    return f


def plot(rows, starts, title, out):
    import matplotlib
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt
    import numpy as np

    episodes = [r["episodes"] for r in rows]
    mean = [r["mean_reward"] for r in rows]
    best = []
    for r in rows:  # best so far across runs, too
        best.append(max(r["best_reward"], best[-1] if best else r["best_reward"]))
    greedy = [r["greedy_reward"] for r in rows]
    window = max(1, len(rows) // 50)

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.plot(episodes, mean, color="#1f77b4", linewidth=0.5, alpha=0.35)
    ax.plot(episodes, moving_average(mean, window), color="#1f77b4",
            linewidth=1.6,
            label="mean sampled return (%d-iteration average)" % window)
    ax.plot(episodes, best, color="#d62728", linewidth=1.4,
            label="best return so far")
    ax.plot(episodes, moving_average(greedy, window), color="#2ca02c",
            linewidth=1.2, label="greedy return (same average)")
    for i, s in enumerate(starts):
        ax.axvline(s, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate("run %d (continues run %d)" % (i + 2, i + 1), (s, 0),
                    xycoords=("data", "axes fraction"), xytext=(3, 3),
                    textcoords="offset points", fontsize=7, color="dimgrey")
    ax.set_xlim(0, episodes[-1])
    ax.set_xlabel("Rollouts (episodes)")
    ax.set_ylabel("Normalised return (throughput / compute bound)")
    ax.grid(linewidth=0.3)
    ax.legend(fontsize=7, frameon=False, loc="lower right")

    # Wall time on the top axis (monotone in episodes, so a second scale of
    # the same axis rather than a second curve).
    xs = [0.0] + episodes
    ts = [0.0] + [r["elapsed_s"] for r in rows]
    to_time = interpolate(xs, ts)
    to_episodes = interpolate(ts, xs)
    top = ax.secondary_xaxis(
        "top", functions=(lambda v: np.asarray(to_time(np.ravel(v))).reshape(
            np.shape(v)),
                          lambda v: np.asarray(to_episodes(np.ravel(v))).reshape(
                              np.shape(v))))
    top.set_xlabel("Training wall time (s)", fontsize=8)
    top.tick_params(labelsize=7)

    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=150)
    plt.close(fig)


def main(argv):
    parser = argparse.ArgumentParser(
        description="Plot an `arachne train` curve CSV (mean, best and "
        "greedy normalised return against rollouts and wall time).")
    parser.add_argument("curves", nargs="+", metavar="CURVE.csv",
                        help="curve CSVs of one policy, in training order")
    parser.add_argument("--out", help="PNG to write (default: the last CSV "
                        "with .png instead of .csv)")
    parser.add_argument("--title", help="plot title (default: file name)")
    args = parser.parse_args(argv[1:])
    out = args.out or os.path.splitext(args.curves[-1])[0] + ".png"
    try:
        curves = [read_curve(p) for p in args.curves]
    except (OSError, ValueError) as e:
        sys.stderr.write("plot_training_curve: %s\n" % e)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.stderr.write("plot_training_curve: matplotlib is not installed "
                         "(Debian: python3-matplotlib); no plot written\n")
        return 3
    rows, starts = chain(curves)
    title = args.title or "Training curve: %s (%s rollouts, %.0f s%s)" % (
        os.path.basename(args.curves[-1]).split(".")[0],
        "{:,}".format(int(rows[-1]["episodes"])), rows[-1]["elapsed_s"],
        ", %d runs" % len(curves) if len(curves) > 1 else "")
    plot(rows, starts, title, out)
    sys.stderr.write("plot_training_curve: wrote %s\n" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
