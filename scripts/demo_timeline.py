#!/usr/bin/env python3
"""The live demo's (scripts/demo) waiting, report and timeline plot, from the
event streams `arachne watch --format json` recorded (one JSON object per
line, arachne.v1.Event in protobuf's JSON mapping: int64 fields are strings).

    demo_timeline.py wait EVENTS [--iteration N] [--generation G]
                     [--committed G] [--decision TEXT] [--timeout S]
        returns once the stream shows what is asked (training at iteration
        >= N [of generation >= G], the switch to generation G committed, or
        a decision whose message contains TEXT: its message is printed);
        exit 1 with the last event seen after --timeout seconds, or at once
        when the controller reports an error or an aborted switch (unless
        --tolerate-errors).

    demo_timeline.py report --live EVENTS --reference EVENTS --db CONTROLLER_DB
                     --tokens-per-iteration T [--plot PNG] [--title TEXT]
        prints every decision with its numbers, each switch's bytes moved and
        downtime breakdown (the controller's switch log in its SQLite
        database), and the loss of every iteration beside the run without
        switches, each switch's predicted gain beside the measured one (the
        generations' measured iteration times); writes the timeline plot
        (throughput and loss over time, switches marked: the paper's Figure 8
        shape) when matplotlib is importable, else says so.

Exit codes: 0 ok, 1 a wait that timed out or a loss that does not match
(relative difference above --loss-tolerance), 2 bad input.
"""

import argparse
import json
import re
import sys
import time


def read_events(path):
    events = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line still being written
    except FileNotFoundError:
        pass
    return events


def num(e, field, default=0):
    v = e.get(field, default)
    return float(v) if isinstance(v, (int, float, str)) and v != "" else default


def committed_generations(events):
    out = {}
    for e in events:
        m = re.match(r"generation (\d+) committed", e.get("message", ""))
        if e.get("kind") == "phase" and m:
            out[int(m.group(1))] = e
    return out


def cmd_wait(args):
    deadline = time.time() + args.timeout
    last = None
    while True:
        events = read_events(args.events)
        if events:
            last = events[-1]
        for e in events if not args.tolerate_errors else []:
            if e.get("kind") == "error":
                print(f"demo: the controller reports an error: {e.get('message')}",
                      file=sys.stderr)
                return 1
        if args.calibration:
            for e in events:
                if e.get("kind") == "calibration":
                    print(e.get("message"))
                    return 0
        elif args.decision is not None:
            for e in events:
                if (e.get("kind") == "decision"
                        and args.decision in e.get("message", "")):
                    print(e.get("message"))
                    return 0
        elif args.committed is not None:
            if args.committed in committed_generations(events):
                return 0
        else:
            it = [e for e in events if e.get("kind") == "iteration"
                  and int(num(e, "generation")) >= args.generation]
            if it and max(int(num(e, "iteration")) for e in it) >= args.iteration:
                return 0
        if time.time() > deadline:
            what = ("the first fit of the corrections" if args.calibration
                    else f"a decision on \"{args.decision}\"" if args.decision
                    is not None else f"the switch to generation {args.committed}"
                    if args.committed is not None else
                    f"iteration {args.iteration} of generation >= "
                    f"{args.generation}")
            print(f"demo: timed out after {args.timeout:.0f} s waiting for {what}; "
                  f"last event: {json.dumps(last)}", file=sys.stderr)
            return 1
        time.sleep(0.1)


def losses_by_iteration(events):
    out = {}
    for e in events:
        if e.get("kind") == "iteration" and num(e, "loss") != 0:
            out[int(num(e, "iteration"))] = num(e, "loss")
    return out


def switch_windows(events, t0):
    """(generation, pause start, commit) times relative to t0, per switch
    that paused training (generation >= 2)."""
    pauses = {}
    for e in events:
        m = re.match(r"generation (\d+): pause", e.get("message", ""))
        if e.get("kind") == "phase" and m:
            pauses[int(m.group(1))] = num(e, "time_unix_s") - t0
    out = []
    for g, e in sorted(committed_generations(events).items()):
        if g in pauses:
            out.append((g, pauses[g], num(e, "time_unix_s") - t0))
    return out


def throughput_series(events, t0, tokens_per_iteration, window_s=3.0):
    """Tokens/s at each iteration event over the last >= window_s seconds:
    from the latest event at least window_s earlier, so iterations the
    controller saw only after a gap (it does not poll during a switch) are
    spread over the whole gap rather than counted as a burst."""
    pts = [(num(e, "time_unix_s") - t0, int(num(e, "iteration")))
           for e in events if e.get("kind") == "iteration"]
    times, rates = [], []
    j = 0
    for t, it in pts[1:]:
        while j + 1 < len(pts) and pts[j + 1][0] <= t - window_s:
            j += 1
        dt = t - pts[j][0]
        if dt > 0:
            times.append(t)
            rates.append((it - pts[j][1]) / dt * tokens_per_iteration)
    return times, rates


def switch_records(db):
    """The controller's switch log (the `switches` table of controller.db):
    generation -> SwitchTimings as JSON (protobuf JSON, camelCase names)."""
    import sqlite3
    out = {}
    try:
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        for g, outcome, timings in c.execute(
                "select generation, outcome, timings_json from switches "
                "order by generation"):
            try:
                out[int(g)] = json.loads(timings)
            except json.JSONDecodeError:
                out[int(g)] = {}
            out[int(g)]["outcome"] = outcome
        c.close()
    except sqlite3.Error as e:
        print(f"demo: cannot read the switch log in {db}: {e}", file=sys.stderr)
    return out


def measured_iteration_s(db):
    """generation -> its measured iteration time (s), from the `generations`
    table of controller.db; generations not measured yet are left out."""
    import sqlite3
    out = {}
    try:
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        for g, t in c.execute(
                "select generation, measured_iteration_s from generations"):
            if t and t > 0:
                out[int(g)] = float(t)
        c.close()
    except sqlite3.Error as e:
        print(f"demo: cannot read the generations in {db}: {e}", file=sys.stderr)
    return out


def gains(events, measured, within=0.25):
    """(generation, trigger, predicted new/old, measured new/old, ok) per
    switch a gain decided (not a forced one) whose generation and the one
    before it were both measured; ok when the predicted speed-up is within
    `within` of the measured one (ratio of the two in [1 - within,
    1 + within])."""
    out = []
    for e in events:
        d = e.get("decision") if e.get("kind") == "decision" else None
        if not d or d.get("verdict") != "switch":
            continue
        g = int(num(d, "generation"))
        old, new = num(d, "old_throughput"), num(d, "new_throughput")
        if old <= 0 or new <= 0 or g - 1 not in measured or g not in measured:
            continue  # a forced switch (the old plan no longer fits)
        predicted = new / old
        actual = measured[g - 1] / measured[g]
        out.append((g, d.get("trigger"), predicted, actual,
                    abs(predicted / actual - 1) <= within))
    return out


def cmd_report(args):
    live = read_events(args.live)
    ref = read_events(args.reference)
    if not live:
        print(f"demo: no events in {args.live}", file=sys.stderr)
        return 2
    print("decisions")
    for e in live:
        if e.get("kind") != "decision":
            continue
        d = e.get("decision")
        if not d:
            print(f"  {e.get('message')}")
            continue
        gen = int(num(d, "generation"))
        print(f"  {d.get('verdict')} ({d.get('trigger')})"
              f"{f' -> generation {gen}' if gen else ''}: "
              f"old {num(d, 'old_throughput'):.3f} -> new "
              f"{num(d, 'new_throughput'):.3f} it/s predicted; gain "
              f"{num(d, 'gain_s'):.3f} s over the {num(d, 'horizon_s'):.0f} s "
              f"horizon vs downtime estimate {num(d, 'downtime_estimate_s'):.3f} s "
              f"(migration {num(d, 'migration_estimate_s'):.3f} + fixed "
              f"{num(d, 'fixed_cost_s'):.3f}); decided in "
              f"{num(d, 'decision_s'):.3f} s (planner call "
              f"{num(d, 'planning_s'):.3f} s)")
        print(f"    {d.get('reason')}")

    print("\nswitches (the controller's switch log, controller.db; downtime = "
          "pause to resume; bytes: sent by the agents in both stages)")
    for g, t in sorted(switch_records(args.db).items()):
        f = lambda k: num(t, k)  # noqa: E731
        if g == 1:
            print(f"  generation 1 (first plan) {t.get('outcome')}: prepare "
                  f"{f('prepareS'):.3f} s, rebuild {f('rebuildS'):.3f} s, "
                  f"total {f('totalS'):.3f} s")
            continue
        print(f"  generation {g} {t.get('outcome')}, paused after iteration "
              f"{int(f('pausedAtIteration'))}: downtime {f('downtimeS'):.3f} s = "
              f"pause {f('pauseS'):.3f} + stage1 {f('stage1S'):.3f} + stage2 "
              f"{f('stage2S'):.3f} + rebuild {f('rebuildS'):.3f} + commit "
              f"{f('commitS'):.3f} + resume {f('resumeS'):.3f}")
        print(f"    {int(f('bytesMoved'))} bytes moved ({f('bytesMoved') / 2**20:.2f} "
              f"MiB: stage1 {f('bytesStage1') / 2**20:.2f} MiB, stage2 "
              f"{f('bytesStage2') / 2**20:.2f} MiB; migration estimate {f('migrationEstimateS'):.4f} s); prepare "
              f"{f('prepareS'):.3f} s while training went on; slowest agent: pause "
              f"{f('agentPauseS'):.3f}, stage1 {f('agentStage1S'):.3f}, stage2 "
              f"{f('agentStage2S'):.3f}, rebuild {f('agentRebuildS'):.3f} s")

    print("\npredicted against measured gains (switches a gain decided; "
          "measured: the generations' median iteration times)")
    rows = gains(live, measured_iteration_s(args.db))
    for g, trigger, predicted, actual, ok in rows:
        print(f"  generation {g} ({trigger}): predicted x{predicted:.3f}, "
              f"measured x{actual:.3f} ({'within' if ok else 'NOT within'} "
              f"25%)")
    if not rows:
        print("  none measured on both sides")

    lv, rf = losses_by_iteration(live), losses_by_iteration(ref)
    common = sorted(set(lv) & set(rf))
    print(f"\nloss continuity: {len(common)} iterations seen in both runs "
          f"(live {len(lv)}, without switches {len(rf)})")
    worst = 0.0
    gens = {}
    for e in live:
        if e.get("kind") == "iteration":
            gens[int(num(e, "iteration"))] = int(num(e, "generation"))
    for i in common:
        rel = abs(lv[i] - rf[i]) / max(abs(rf[i]), 1e-12)
        worst = max(worst, rel)
        print(f"  iteration {i:4d}  generation {gens.get(i, 0)}  live "
              f"{lv[i]:.6f}  without switches {rf[i]:.6f}  rel diff {rel:.1e}")
    ok = bool(common) and worst <= args.loss_tolerance
    print(f"  largest relative difference {worst:.2e} "
          f"({'within' if ok else 'NOT within'} {args.loss_tolerance:g})")

    if args.plot:
        plot(live, args.tokens_per_iteration, args.plot, args.title)
    return 0 if ok else 1


def plot(events, tokens_per_iteration, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only; no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"demo: no matplotlib in {sys.executable}; timeline plot skipped "
              "(Debian: python3-matplotlib)", file=sys.stderr)
        return
    its = [e for e in events if e.get("kind") == "iteration"]
    if not its:
        return
    t0 = num(its[0], "time_unix_s")
    times, rates = throughput_series(events, t0, tokens_per_iteration)
    windows = switch_windows(events, t0)
    # No iteration runs between pause and resume: the line drops to 0 there.
    pts = [(t, r) for t, r in zip(times, rates)
           if not any(a < t < b for _, a, b in windows)]
    for _, a, b in windows:
        pts += [(a, 0.0), (b, 0.0)]
    pts.sort()
    times, rates = [p[0] for p in pts], [p[1] for p in pts]
    loss_t = [num(e, "time_unix_s") - t0 for e in its if num(e, "loss") != 0]
    loss_v = [num(e, "loss") for e in its if num(e, "loss") != 0]

    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.plot(times, [r / 1e3 for r in rates], color="#1f77b4", lw=1.6,
            label="throughput (3 s window)")
    ax.set_xlabel("time since training started (s)")
    ax.set_ylabel("throughput (k tokens/s)", color="#1f77b4")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(loss_t, loss_v, color="#d62728", lw=1.2, ls="--", label="loss")
    ax2.set_ylabel("loss", color="#d62728")
    labels = {}
    for e in events:
        if e.get("kind") == "decision" and e.get("decision"):
            g = int(num(e["decision"], "generation"))
            if g:
                labels[g] = e["decision"].get("trigger", "")
    for g, start, end in windows:
        ax.axvspan(start, end, color="#7f7f7f", alpha=0.25, lw=0)
        ax.axvline(start, color="#7f7f7f", lw=0.8)
        ax.annotate(f"g{g}: {labels.get(g, '')}\n{end - start:.1f} s down",
                    xy=(start, 0), xycoords=("data", "axes fraction"),
                    xytext=(3, 6), textcoords="offset points", fontsize=8,
                    rotation=90, va="bottom")
    ax.set_title(f"{title} (join, then drain; shaded: downtime)")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\nwrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait")
    w.add_argument("events")
    w.add_argument("--iteration", type=int, default=0)
    w.add_argument("--generation", type=int, default=1)
    w.add_argument("--committed", type=int)
    w.add_argument("--decision")
    w.add_argument("--calibration", action="store_true",
                   help="wait for the first fit of the corrections; print it")
    w.add_argument("--timeout", type=float, default=60)
    w.add_argument("--tolerate-errors", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("--live", required=True)
    r.add_argument("--reference", required=True)
    r.add_argument("--db", required=True)
    r.add_argument("--tokens-per-iteration", type=int, required=True)
    r.add_argument("--loss-tolerance", type=float, default=1e-4)
    r.add_argument("--plot")
    r.add_argument("--title", default="live demo on virtual testbed GPUs",
                   help="the plot's title, before \"(join, then drain)\"")
    args = p.parse_args()
    return cmd_wait(args) if args.cmd == "wait" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
