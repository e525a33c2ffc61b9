#!/usr/bin/env python3
"""Quality against planning budget (issue 17), from one `arachne bench`
results.csv per budget, all of the same planner on the same suite.

    python3 bench/budget_curve.py 0.05=R1.csv 0.1=R2.csv 0.3=R3.csv 0.9=R4.csv \
        [--reference 0.9] [--out curve.md] [--plot curve.png]

Each composition's throughput at each budget over its throughput at the
reference budget (default: the largest); per budget the median, the 10th
percentile and the minimum of that ratio and the p50 / max planning time.
The issue's bar: the median at 0.1 s at least 0.99. Last, the budget
inversions: for each pair of budgets, the compositions whose plan at the
smaller budget is faster than at the larger (more than 0.01%; the search
itself does not depend on the budget, so these come from the machine's
speed varying between runs).
"""
import argparse, csv, statistics as st

ap = argparse.ArgumentParser()
ap.add_argument('runs', nargs='+', help='BUDGET=results.csv')
ap.add_argument('--reference', type=float)
ap.add_argument('--out'); ap.add_argument('--plot')
a = ap.parse_args()
runs = {}
for spec in a.runs:
    b, f = spec.split('=', 1)
    runs[float(b)] = {(r['scenario'], r['composition']): r for r in csv.DictReader(open(f))}
ref = a.reference or max(runs)
thr = lambda r: float(r['throughput_iters_per_s']) if r and r['status'] == 'ok' else 0.0
lines = ['| budget (s) | compositions | median ÷ reference | p10 | min | planning time p50 / max (s) |',
         '|---:|---:|---:|---:|---:|---|']
curve = []
for b in sorted(runs):
    ratios, times = [], []
    for k, r in runs[ref].items():
        base = thr(r)
        if not base or k not in runs[b]:
            continue
        ratios.append(thr(runs[b][k]) / base)
        times.append(float(runs[b][k]['planning_time_s']))
    ratios.sort(); times.sort()
    med = st.median(ratios)
    curve.append((b, med, ratios[len(ratios) // 10], ratios[0]))
    lines.append(f"| {b:g} | {len(ratios)} | {med:.4f} | {ratios[len(ratios)//10]:.4f} | {ratios[0]:.4f} | "
                 f"{times[len(times)//2]:.3f} / {times[-1]:.3f} |")
text = '\n'.join(lines) + f"\n\nreference: the {ref:g} s plan of each composition\n"
budgets = sorted(runs)
for i, small in enumerate(budgets):
    for large in budgets[i + 1:]:
        both = [k for k in runs[small] if k in runs[large] and thr(runs[large][k])]
        worse = [k for k in both if thr(runs[small][k]) > thr(runs[large][k]) * 1.0001]
        text += f"inversions {small:g} s > {large:g} s: {len(worse)} of {len(both)}\n"
print(text, end='')
if a.out:
    open(a.out, 'w').write(text)
if a.plot:
    try:
        import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt
    except ImportError:
        print('no matplotlib: plot skipped')
    else:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        xs = [c[0] for c in curve]
        ax.plot(xs, [c[1] for c in curve], 'o-', label='median')
        ax.plot(xs, [c[2] for c in curve], 's--', label='10th percentile')
        ax.plot(xs, [c[3] for c in curve], 'v:', label='minimum')
        ax.axhline(0.99, color='grey', lw=0.8)
        ax.set_xscale('log'); ax.set_xlabel('planning budget (s)')
        ax.set_ylabel(f'throughput ÷ {ref:g} s plan'); ax.legend(); ax.grid(alpha=0.3)
        fig.tight_layout(); fig.savefig(a.plot, dpi=120)
        print(f'wrote {a.plot}')
