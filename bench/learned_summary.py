#!/usr/bin/env python3
"""The learned planner against the issue's bar, from an `arachne bench`
results.csv: per figure, how many compositions reach the best of the other
baselines (within 0.5%) and 0.98 of the exact planner, the ratios, and the
learned planner's planning time; then every shortfall.

    python3 bench/learned_summary.py bench/results/results.csv

Compositions where no planner found a plan are left out. The
"template-search" ablation (the learned planner's search with a uniform
policy) is not a baseline: when the results have it, its own line reports
the learned planner against it.
"""
import csv,sys,math,statistics as st
if len(sys.argv) != 2:
    sys.exit("usage: learned_summary.py RESULTS_CSV")
rows=list(csv.DictReader(open(sys.argv[1])))
key=lambda r:(r['scenario'],r['composition'])
by={}
for r in rows:
    by.setdefault(key(r),{})[r['planner']]=r
figs={}
for k,d in by.items():
    fig=next(iter(d.values()))['figure']
    figs.setdefault(fig,[]).append((k,d))
NOT_BASELINES=('learned','exact','template-search')
def thr(r): return float(r['throughput_iters_per_s']) if r and r['status']=='ok' else 0.0
print("| figure | compositions | learned ≥ best baseline (−0.5%) | learned ≥ 0.98 × exact | learned ÷ best baseline (min / median / max) | learned ÷ exact (min / median / max) | learned planning time p50 / max |")
print("|---|---:|---:|---:|---|---|---|")
allb=[];alle=[];times=[];okb=0;oke=0;n=0;fails=[];abl=[]
order=sorted(figs, key=lambda f:(f=='8', [int(''.join(c for c in f if c.isdigit()) or 0)], f))
for fig in order:
    rb=[];re_=[];tt=[];cb=0;ce=0;cnt=0
    for k,d in figs[fig]:
        l=d.get('learned')
        if not l: continue
        if l['status']!='ok' and all(r['status']!='ok' for p,r in d.items() if p!='learned'): continue
        cnt+=1
        t=thr(l); tt.append(float(l['planning_time_s']))
        b=max([thr(r) for p,r in d.items() if p not in NOT_BASELINES]+[0])
        e=thr(d.get('exact'))
        x=t/b if b else float('inf'); y=t/e if e else float('inf')
        if b: rb.append(x)
        if e: re_.append(y)
        okB = (not b) or x>=0.995; okE=(not e) or y>=0.98
        cb+=okB; ce+=okE
        if not (okB and okE): fails.append((k,x,y))
        a=thr(d.get('template-search'))
        if a and t: abl.append(t/a)
    if not cnt: continue
    f=lambda xs: f"{min(xs):.3f} / {st.median(xs):.3f} / {max(xs):.3f}" if xs else "-"
    tt.sort()
    print(f"| {fig} | {cnt} | {cb} | {ce} | {f(rb)} | {f(re_)} | {tt[len(tt)//2]:.2f} / {tt[-1]:.2f} s |")
    allb+=rb;alle+=re_;times+=tt;okb+=cb;oke+=ce;n+=cnt
g=lambda xs: math.exp(sum(math.log(x) for x in xs)/len(xs))
times.sort()
print(f"\nall: {n} compositions; learned >= best baseline on {okb}, >= 0.98 exact on {oke}; geomean vs best baseline {g(allb):.3f} (min {min(allb):.3f}), vs exact {g(alle):.3f} (min {min(alle):.3f}); planning time p50 {times[len(times)//2]:.2f} s, max {times[-1]:.2f} s; both bars met on {n-len(fails)}")
for k,x,y in fails: print(f"  short: {k[0]} {k[1]}: ÷best {x:.3f}, ÷exact {y:.3f}")
if abl:
    print(f"ablation: learned / template-search (uniform policy, same search) on {len(abl)} compositions: geomean {g(abl):.3f}, min {min(abl):.3f}, max {max(abl):.3f}; learned faster on {sum(x>1.0005 for x in abl)}, slower on {sum(x<0.9995 for x in abl)}")
