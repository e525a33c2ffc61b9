#!/usr/bin/env python3
"""The model-conditioned policy against issue 17's bars, from `arachne bench`
results.csv files.

    python3 bench/general_policy_summary.py --baselines B.csv [B2.csv ...] \
        --general G.csv [G2.csv ...] [--per-model P.csv] [--out table.md]

--baselines: runs of the baselines (every planner but learned and
template-search counts; exact too, as in the bench's "best planner").
--general: runs of the learned planner with only general.pt in its policies
directory (ARACHNE_POLICIES_DIR), planner "learned".
--per-model: runs of the learned planner with the per-model checkpoints;
compositions of models that have a policy of their own (or of a declared
relative) compare the two policies.
Bars (issue 17): the general policy's plan at least the best baseline's,
ties within 0.5%, everywhere; on the per-model policies' models at least
0.99 of that policy's plan. Prints one row per composition and a summary.
"""
import argparse, csv, math, statistics as st

ap = argparse.ArgumentParser()
ap.add_argument('--baselines', nargs='+', required=True)
ap.add_argument('--general', nargs='+', required=True)
ap.add_argument('--per-model', nargs='*', default=[])
ap.add_argument('--out')
a = ap.parse_args()

def rows(files):
    for f in files:
        yield from csv.DictReader(open(f))

def thr(r):
    return float(r['throughput_iters_per_s']) if r and r['status'] == 'ok' else 0.0

key = lambda r: (r['scenario'], r['composition'])
NOT_BASELINES = ('learned', 'template-search')
best, best_name, model = {}, {}, {}
for r in rows(a.baselines):
    if r['planner'] in NOT_BASELINES:
        continue
    k = key(r); model[k] = r['model']
    if thr(r) > best.get(k, 0):
        best[k] = thr(r); best_name[k] = r['planner']
general = {key(r): r for r in rows(a.general) if r['planner'] == 'learned'}
per_model = {key(r): r for r in rows(a.per_model) if r['planner'] == 'learned'}

lines = ['| scenario | model | composition | general it/s | best baseline | ÷ best | per-model policy it/s | ÷ per-model | general planning s |',
         '|---|---|---|---:|---|---:|---:|---:|---:|']
vs_best, vs_own, times, short = [], [], [], []
for k in sorted(general, key=lambda k: (k[0], int(general[k]['gpus']))):
    g = general[k]; t = thr(g); b = best.get(k, 0)
    if not b and not t:
        continue
    x = t / b if b else float('inf')
    if b: vs_best.append(x)
    times.append(float(g['planning_time_s']))
    p = per_model.get(k); own = thr(p) if p else 0
    y = t / own if own else None
    if y is not None: vs_own.append(y)
    if (b and x < 0.995) or (y is not None and y < 0.99):
        short.append((k, x, y))
    lines.append(f"| {k[0]} | {g['model']} | {k[1]} | {t:.4f} | {best_name.get(k, '-')} {b:.4f} | "
                 f"{x:.3f} | {own:.4f} | {'-' if y is None else f'{y:.3f}'} | {float(g['planning_time_s']):.2f} |"
                 if own else
                 f"| {k[0]} | {g['model']} | {k[1]} | {t:.4f} | {best_name.get(k, '-')} {b:.4f} | "
                 f"{x:.3f} | - | - | {float(g['planning_time_s']):.2f} |")
geo = lambda xs: math.exp(sum(math.log(max(x, 1e-9)) for x in xs) / len(xs))
times.sort()
summary = [f"\n{len(vs_best)} compositions with a baseline plan: general ≥ best baseline (−0.5%) on "
           f"{sum(x >= 0.995 for x in vs_best)}, geomean {geo(vs_best):.3f}, min {min(vs_best):.3f}; "
           f"planning time p50 {times[len(times)//2]:.2f} s, max {times[-1]:.2f} s"]
if vs_own:
    summary.append(f"{len(vs_own)} compositions of models with their own policy: general ≥ 0.99 × per-model on "
                   f"{sum(y >= 0.99 for y in vs_own)}, geomean {geo(vs_own):.3f}, min {min(vs_own):.3f}, "
                   f"median {st.median(vs_own):.3f}")
for k, x, y in short:
    summary.append(f"  short: {k[0]} {k[1]}: ÷best {x:.3f}" + ('' if y is None else f", ÷per-model {y:.3f}"))
text = '\n'.join(lines + summary) + '\n'
print(text, end='')
if a.out:
    open(a.out, 'w').write(text)
