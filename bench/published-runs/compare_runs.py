#!/usr/bin/env python3
"""Predicted vs measured for the published runs of this directory, with
`arachne calibrate`:

  own-preset   every run under its own framework (preset + the run's
               overrides), uncalibrated (the "before" columns);
  all-presets  every run with its framework replaced by each plain preset;
  after-fit    the round trip: per cluster, fit on its dev runs (the
               `# split: dev` comments) and predict the rest (held out);
  variant      sensitivity checks of assumptions (micro-batch, attention).

Writes bench/results/measured_runs.csv, measured_runs_choices.csv (the fit
on every choice of one or two runs) and bench/results/measured_runs.md,
then bench/measured_runs_plot.py draws bench/results/measured_runs.png.

    /usr/bin/python3 bench/published-runs/compare_runs.py [--arachne BIN]
"""
import argparse
import concurrent.futures
import copy
import csv
import itertools
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "bench", "results")
FILES = ["megatron-lm-2021.yaml", "bloom-176b.yaml", "llm-foundry-mpt.yaml",
         "torchtitan-llama3-8b.yaml", "dlperf-v100.yaml"]
PRESETS = ["megatron-core", "megatron-deepspeed", "deepspeed-zero1", "fsdp",
           "arachne-reference"]
NUM = r"(-|[0-9.]+)"
PCT = r"(-|[+-][0-9.]+%)"
ROW = re.compile(r"^(?P<label>.+?)\s+(?P<set>fitted|held-out)\s+" +
                 r"\s+".join([NUM, NUM, NUM, PCT, PCT, NUM, NUM, NUM, PCT, PCT]) +
                 r"(?P<nofit>\s+\(predicted not to fit\))?\s*$")
COMMANDS = []


def splits(path):
    """label -> dev/eval from the `# split:` comment above each run."""
    out, pending = {}, None
    for line in open(path):
        m = re.match(r"\s*# split: (dev|eval)", line)
        if m:
            pending = m.group(1)
        m = re.match(r'\s*- label: "(.*)"', line)
        if m:
            out[m.group(1)] = pending or "eval"
            pending = None
    return out


def calibrate(binary, path, fit_on=None, fit=None, show=None, extra=(), record=True):
    cmd = [binary, "calibrate", "--runs", path] + list(extra)
    if fit_on:
        cmd += ["--fit-on", ",".join(fit_on)]
    if fit:
        cmd += ["--fit", ",".join(fit)]
    if record:
        COMMANDS.append(" ".join(show or cmd).replace(os.path.dirname(path) + "/profiles", "<profiles copy>"))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    rows, tail, in_tail = {}, [], False
    for line in p.stdout.splitlines():
        m = ROW.match(line)
        if m and not in_tail:
            g = m.groups()
            f = lambda v: None if v == "-" else float(v.rstrip("%"))
            rows[m.group("label").strip()] = dict(
                set=m.group("set"), measured_s=f(g[2]), before_s=f(g[3]), after_s=f(g[4]),
                measured_gib=f(g[7]), before_gib=f(g[8]), after_gib=f(g[9]),
                fits=m.group("nofit") is None)
        elif line.startswith("fitted runs:"):
            in_tail = True
        if in_tail and line.strip():
            tail.append(line.rstrip())
    return rows, tail


def predict(binary, path, show, extra=()):
    """Uncalibrated predictions of every run of `path` (the `before`
    columns). A fit is needed to get the table; try what the runs can
    determine, and per run when the whole file cannot be fitted."""
    last = None
    for fit in (["compute_scale"], None, ["iteration_fixed_ms"]):
        try:
            return calibrate(binary, path, fit=fit, extra=extra,
                             show=show + list(extra) + (["--fit", ",".join(fit)] if fit else []))[0]
        except RuntimeError as e:
            COMMANDS.pop()
            last = e
    doc = yaml.safe_load(open(path))
    rows = {}
    for i, r in enumerate(doc["runs"]):
        one = os.path.join(os.path.dirname(path), f"one-{i}-" + os.path.basename(path))
        with open(one, "w") as fh:
            yaml.safe_dump(dict(runs=[r]), fh, sort_keys=False, width=1000)
        for fit in (["compute_scale"], ["iteration_fixed_ms"], None):
            try:
                rows.update(calibrate(binary, one, fit=fit, extra=extra)[0])
                COMMANDS.pop()
                break
            except RuntimeError as e:
                COMMANDS.pop()
                last = e
        else:
            print(f"warning: {r['label']}: not priced: {last}", file=sys.stderr)
    COMMANDS.append(" ".join(show) + "   # per run (the file as a whole cannot be fitted)")
    return rows


def with_framework(doc, preset):
    d = copy.deepcopy(doc)
    for r in d["runs"]:
        r["training"]["framework"] = preset
    return d


def write_tmp(doc, tmpdir, name):
    path = os.path.join(tmpdir, name)
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False, width=1000)
    return path


def err(p, m):
    return None if p is None or m is None else p / m - 1


def fmt_err(e):
    return "-" if e is None else f"{100 * e:+.1f}%"


def stats(errs):
    errs = [e for e in errs if e is not None]
    if not errs:
        return "-", "-", "-"
    mae = sum(abs(e) for e in errs) / len(errs)
    rms = math.sqrt(sum(math.log1p(e) ** 2 for e in errs) / len(errs))
    w10 = sum(abs(e) <= 0.10 for e in errs)
    return f"{100 * mae:.1f}%", f"{rms:.3f}", f"{w10}/{len(errs)}"


def phase_of(mode):
    """The csv phase of a round-trip fit mode."""
    if mode == "auto":
        return "after-fit"
    if mode == "compute_scale":
        return "after-fit-scale-only"
    return "after-fit-" + mode.split(",")[1]  # e.g. after-fit-attention_scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arachne", default=os.path.join(ROOT, "build", "planner_service", "cli", "arachne"))
    a = ap.parse_args()
    B = a.arachne
    rel = lambda p: os.path.relpath(p, ROOT)
    tmpdir = tempfile.mkdtemp(prefix="published-runs-")
    docs = {f: yaml.safe_load(open(os.path.join(HERE, f))) for f in FILES}
    split = {f: splits(os.path.join(HERE, f)) for f in FILES}
    csv_rows = []
    md = []

    # --- own preset, uncalibrated ------------------------------------------
    own = {}
    for f in FILES:
        rows = predict(B, os.path.join(HERE, f),
                       show=["arachne", "calibrate", "--runs", "bench/published-runs/" + f])
        own[f] = rows
        for lab, r in rows.items():
            csv_rows.append(dict(file=f, label=lab, split=split[f][lab], preset="own", phase="own-preset",
                                 fitted_on="", measured_s=r["measured_s"], predicted_s=r["before_s"],
                                 measured_gib=r["measured_gib"], predicted_gib=r["before_gib"],
                                 fits=r["fits"]))

    # --- every preset --------------------------------------------------------
    allp = {}
    for f in FILES:
        for p in PRESETS:
            path = write_tmp(with_framework(docs[f], p), tmpdir, f"{p}-{f}")
            rows = predict(B, path, show=["arachne", "calibrate", "--runs",
                                          f"'<bench/published-runs/{f} with training.framework: {p}>'"])
            allp[(f, p)] = rows
            for lab, r in rows.items():
                csv_rows.append(dict(file=f, label=lab, split=split[f][lab], preset=p, phase="all-presets",
                                     fitted_on="", measured_s=r["measured_s"], predicted_s=r["before_s"],
                                     measured_gib=r["measured_gib"], predicted_gib=r["before_gib"],
                                     fits=r["fits"]))

    # --- round trip per cluster ---------------------------------------------
    groups = []  # (name, file for the table, doc, dev labels)
    for f in ["megatron-lm-2021.yaml", "torchtitan-llama3-8b.yaml"]:
        dev = [l for l, s in split[f].items() if s == "dev"]
        groups.append((f.replace(".yaml", ""), f, docs[f], dev, os.path.join(HERE, f)))
    # DLPerf measured two frameworks on one cluster: a calibration is of one
    # framework, so each is fitted on its own two runs, the OneFlow ones of
    # the same configurations as Megatron-LM's dev runs.
    ddoc = docs["dlperf-v100.yaml"]
    mdev = [l for l, s in split["dlperf-v100.yaml"].items() if s == "dev"]
    for fw in ["megatron", "oneflow"]:
        sub = dict(source=ddoc["source"], runs=[r for r in ddoc["runs"] if f"dlperf {fw} " in r["label"]])
        dev = [l.replace("dlperf megatron ", f"dlperf {fw} ") for l in mdev]
        groups.append((f"dlperf-v100 {'Megatron-LM' if fw == 'megatron' else 'OneFlow'}", "dlperf-v100.yaml",
                       sub, dev, write_tmp(sub, tmpdir, f"dlperf-{fw}.yaml")))
    fdoc = docs["llm-foundry-mpt.yaml"]
    for gpu in ["H100-80GB", "A100-80GB", "A100-40GB"]:
        sub = dict(source=fdoc["source"], runs=[r for r in fdoc["runs"]
                                                if r["cluster"]["node_groups"][0]["gpu"] == gpu])
        dev = [r["label"] for r in sub["runs"] if split["llm-foundry-mpt.yaml"][r["label"]] == "dev"]
        groups.append((f"llm-foundry {gpu}", "llm-foundry-mpt.yaml", sub, dev,
                       write_tmp(sub, tmpdir, f"foundry-{gpu}.yaml")))
    # BLOOM (one run): fitted on the Megatron-LM 2021 dev runs (same GPU,
    # another framework) and predicted.
    mdoc = docs["megatron-lm-2021.yaml"]
    bl = dict(source="Megatron-LM 2021 dev runs + BLOOM",
              runs=[r for r in mdoc["runs"] if split["megatron-lm-2021.yaml"][r["label"]] == "dev"]
              + docs["bloom-176b.yaml"]["runs"])
    groups.append(("BLOOM from Megatron-LM 2021 dev", "bloom-176b.yaml", bl,
                   [r["label"] for r in bl["runs"][:-1]], write_tmp(bl, tmpdir, "bloom-transfer.yaml")))
    # The 2021-Megatron runs again with flash attention (section 3 shows why).
    fl = copy.deepcopy(mdoc)
    for r in fl["runs"]:
        r["training"]["framework"]["attention"] = "flash"
    groups.insert(1, ("megatron-lm-2021 (attention: flash)", "megatron-lm-2021.yaml", fl,
                      [l for l, s_ in split["megatron-lm-2021.yaml"].items() if s_ == "dev"],
                      write_tmp(fl, tmpdir, "megatron-flash.yaml")))
    # Attention scale: llm-foundry's clusters span 2k to 64k tokens, so the
    # flash-attention kernel's share of the time varies by run. Fitted on two
    # runs picked by rule, as a user calibrating it would measure one short
    # and one long sequence: the shortest-sequence dev run and the
    # longest-sequence run (the largest model among ties).
    attn_groups = []
    for name, f, doc, dev, path in groups:
        if not name.startswith("llm-foundry"):
            continue
        by_label = {r["label"]: r for r in doc["runs"]}
        size = lambda r: r["model"]["num_layers"] * r["model"]["hidden"] ** 2
        short = min(dev, key=lambda l: (by_label[l]["training"]["seq_len"], -size(by_label[l])))
        long_ = max(doc["runs"], key=lambda r: (r["training"]["seq_len"], size(r)))["label"]
        attn_groups.append((name, f, doc, [short, long_], path))
    # TP-communication scale: DLPerf's dev runs are at TP 1 and TP 4.
    tp_groups = [g for g in groups if g[0].startswith("dlperf")]
    fits = []
    for mode in ("auto", "compute_scale", "compute_scale,attention_scale", "compute_scale,tp_comm_scale"):
        chosen = {"compute_scale,attention_scale": attn_groups, "compute_scale,tp_comm_scale": tp_groups}
        for name, f, doc, dev, path in chosen.get(mode, groups):
            try:
                rows, tail = calibrate(B, path, fit_on=dev, fit=None if mode == "auto" else mode.split(","),
                                       show=["arachne", "calibrate", "--runs",
                                             rel(path) if path.startswith(ROOT) else f"'<{name} runs>'",
                                             "--fit-on", "'" + ",".join(dev) + "'"]
                                       + ([] if mode == "auto" else ["--fit", mode]))
            except RuntimeError as e:
                fits.append((name, mode, dev, [f"refused: {e}"], f))
                continue
            fits.append((name, mode, dev, tail, f))
            for lab, r in rows.items():
                if f == "bloom-176b.yaml" and r["set"] == "fitted":
                    continue
                csv_rows.append(dict(file=f, label=lab, split=split[f].get(lab, "dev"),
                                     preset="own" if "flash" not in name else "own+flash",
                                     phase=phase_of(mode),
                                     fitted_on=("fitted" if r["set"] == "fitted" else "held-out"),
                                     measured_s=r["measured_s"], predicted_s=r["after_s"],
                                     measured_gib=r["measured_gib"], predicted_gib=r["after_gib"],
                                     fits=r["fits"], group=name, before_s=r["before_s"]))

    # --- every choice of fit runs -------------------------------------------
    # The round trip above fits on one fixed choice of dev runs. A user
    # calibrates on whichever one or two runs they have, so the same fit
    # (compute scale) is repeated on every single run and every pair of each
    # cluster, predicting the cluster's other runs each time.
    choice_groups = [g for g in groups if not g[0].startswith("BLOOM") and "(attention" not in g[0]]
    jobs = []
    for name, f, doc, dev, path in choice_groups:
        labels = [r["label"] for r in doc["runs"]]
        for k in (1, 2):
            for combo in itertools.combinations(labels, k):
                if len(combo) < len(labels):
                    jobs.append((name, k, combo, path))

    def run_choice(job):
        name, k, combo, path = job
        try:
            rows, _ = calibrate(B, path, fit_on=list(combo), fit=["compute_scale"], record=False)
        except RuntimeError as e:
            return job, None, str(e)  # refused (the labels' runs cannot fit it)
        held = [(lab, err(r["after_s"], r["measured_s"])) for lab, r in rows.items() if r["set"] == "held-out"]
        return job, [e for _, e in held], {lab for lab, e in held if abs(e) <= 0.10}

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        choice_results = list(pool.map(run_choice, jobs))
    for name, f, doc, dev, path in choice_groups:
        COMMANDS.append(f"arachne calibrate --runs {rel(path) if path.startswith(ROOT) else '<' + name + ' runs>'}"
                        " --fit compute_scale --fit-on '<each run, then each pair of runs>'")

    # --- sensitivity variants -------------------------------------------------
    variants = []
    vd = copy.deepcopy(mdoc)
    for r in vd["runs"]:
        r["training"]["framework"]["attention"] = "flash"
    variants.append(("megatron-lm-2021, attention: flash", "megatron-lm-2021.yaml", vd))
    for flash in (False, True):
        for mb in (2, 4):
            vd = copy.deepcopy(mdoc)
            keep = []
            for r in vd["runs"]:
                if "README" in r["label"]:
                    continue
                if r["training"]["global_batch"] % (mb * r["plan"]["dp"]) == 0:
                    r["plan"]["micro_batch"] = mb
                    if flash:
                        r["training"]["framework"]["attention"] = "flash"
                    keep.append(r)
            vd["runs"] = keep
            label = "attention: flash, " if flash else ""
            variants.append((f"megatron-lm-2021, {label}micro_batch {mb}", "megatron-lm-2021.yaml", vd))
    vd = copy.deepcopy(docs["dlperf-v100.yaml"])
    for r in vd["runs"]:
        r["training"]["framework"]["grad_reduce_bytes_per_param"] = 4
    variants.append(("dlperf-v100, grad_reduce_bytes_per_param: 4", "dlperf-v100.yaml", vd))
    # The A100-80GB GEMM size penalty of profiles/calibration.json set to the
    # A100-40GB's (same silicon): a copy of profiles/ with that one change.
    import json
    import shutil
    prof = os.path.join(tmpdir, "profiles")
    shutil.copytree(os.path.join(ROOT, "profiles"), prof)
    cj = json.load(open(os.path.join(prof, "calibration.json")))
    cj["fitted"]["A100-80GB"]["params"]["gemm_half_gflop"] = cj["fitted"]["A100-40GB"]["params"]["gemm_half_gflop"]
    json.dump(cj, open(os.path.join(prof, "calibration.json"), "w"), indent=1)
    half_note = "A100-80GB gemm_half_gflop = A100-40GB's ({:.3f})".format(
        cj["fitted"]["A100-40GB"]["params"]["gemm_half_gflop"])
    for f in ("megatron-lm-2021.yaml", "bloom-176b.yaml", "llm-foundry-mpt.yaml"):
        variants.append((f"{f.replace('.yaml', '')}, {half_note}", f, docs[f], ["--profiles-dir", prof]))
    vres = []
    for v in variants:
        name, f, doc = v[:3]
        extra = v[3] if len(v) > 3 else []
        path = write_tmp(doc, tmpdir, re.sub(r"[^a-z0-9]+", "-", name.lower()) + ".yaml")
        rows = predict(B, path, show=["arachne", "calibrate", "--runs", f"'<{name}>'"], extra=extra)
        vres.append((name, f, rows))
        for lab, r in rows.items():
            csv_rows.append(dict(file=f, label=lab, split=split[f].get(lab, "eval"), preset=name,
                                 phase="variant", fitted_on="", measured_s=r["measured_s"],
                                 predicted_s=r["before_s"], measured_gib=r["measured_gib"],
                                 predicted_gib=r["before_gib"], fits=r["fits"]))

    os.makedirs(RESULTS, exist_ok=True)
    keys = ["file", "label", "split", "preset", "phase", "fitted_on", "group", "measured_s", "predicted_s",
            "measured_gib", "predicted_gib", "fits", "before_s"]
    with open(os.path.join(RESULTS, "measured_runs.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in csv_rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k, "")) for k in keys})

    with open(os.path.join(RESULTS, "measured_runs_choices.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["cluster", "fit_runs", "fitted_on", "held_out", "within_10pct", "held_out_mae"])
        for (name, k, combo, _), e, _ in choice_results:
            if e is not None:
                w.writerow([name, k, " | ".join(combo), len(e), sum(abs(x) <= 0.10 for x in e),
                            f"{sum(abs(x) for x in e) / len(e):.4f}"])

    # --- markdown ------------------------------------------------------------
    head = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %s"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--short", "planner_service", "profiles"],
                           capture_output=True, text=True).stdout.strip()
    import datetime
    mtime = datetime.datetime.utcfromtimestamp(os.path.getmtime(B)).strftime("%Y-%m-%d %H:%M UTC")
    md.append("# Published measured runs: predicted vs measured\n")
    md.append(f"Cost model as built at {mtime} from `{head[:60]}`" +
              (" plus uncommitted changes in planner_service/ or profiles/ (other work in progress)"
               if dirty else "") + "; rerun the script after cost-model changes.\n")
    md.append("Generated by `bench/published-runs/compare_runs.py` (data set and sources: "
              "[bench/published-runs/README.md](../published-runs/README.md); plot: "
              "`bench/measured_runs_plot.py` -> [measured_runs.png](measured_runs.png)). "
              "err = predicted / measured - 1. `MAE` mean |err|, `rms log` root mean square of "
              "log(predicted/measured), `<=10%` runs within 10%.\n")
    md.append("## 1. Every file under every preset (uncalibrated), iteration time\n")
    md.append("| file | runs | own preset MAE | own rms log | own <=10% | " +
              " | ".join(f"{p} MAE" for p in PRESETS) + " |")
    md.append("|---|---:|---:|---:|---:|" + "---:|" * len(PRESETS))
    for f in FILES:
        o = own[f]
        mae, rms, w10 = stats([err(r["before_s"], r["measured_s"]) for r in o.values()])
        cells = [stats([err(r["before_s"], r["measured_s"]) for r in allp[(f, p)].values()])[0] for p in PRESETS]
        md.append(f"| {f} | {len(o)} | {mae} | {rms} | {w10} | " + " | ".join(cells) + " |")
    md.append("\nPeak memory per GPU (runs with a measured peak):\n")
    md.append("| file | runs | own preset MAE | own <=10% | " + " | ".join(f"{p} MAE" for p in PRESETS) + " |")
    md.append("|---|---:|---:|---:|" + "---:|" * len(PRESETS))
    for f in FILES:
        o = {l: r for l, r in own[f].items() if r["measured_gib"]}
        if not o:
            continue
        mae, _, w10 = stats([err(r["before_gib"], r["measured_gib"]) for r in o.values()])
        cells = [stats([err(r["before_gib"], r["measured_gib"]) for l, r in allp[(f, p)].items()
                        if r["measured_gib"]])[0] for p in PRESETS]
        md.append(f"| {f} | {len(o)} | {mae} | {w10} | " + " | ".join(cells) + " |")

    md.append("\n## 2. Calibration round trip: fit on a cluster's dev runs, predict the rest\n")
    md.append("| cluster | fit | fitted on | held out | held-out MAE before | held-out MAE after | "
              "after <=10% | fitted parameters |")
    md.append("|---|---|---:|---:|---:|---:|---:|---|")
    for name, mode, dev, tail, f in fits:
        phase = phase_of(mode)
        ho = [r for r in csv_rows if r["phase"] == phase and r.get("group") == name
              and r["fitted_on"] == "held-out"]
        before = [err(r["before_s"], r["measured_s"]) for r in ho]
        after = [err(r["predicted_s"], r["measured_s"]) for r in ho]
        params = "; ".join(t.strip() for t in tail if " = " in t or t.startswith("refused"))
        md.append(f"| {name} | {mode} | {len(dev)} | {len(ho)} | {stats(before)[0]} | {stats(after)[0]} | "
                  f"{stats(after)[2]} | {params} |")
    md.append("\nThe fit's own summary per cluster:\n")
    for name, mode, dev, tail, f in fits:
        md.append(f"* **{name}**, fit {mode} (fitted on: {', '.join(dev)}):")
        for t in tail:
            md.append(f"  * {t.strip()}")

    md.append("\n### 2b. Every choice of fit runs (compute scale)\n")
    md.append("The table above fits on one fixed choice. Here `--fit compute_scale` is fitted on every "
              "single run and on every pair of runs of each cluster in turn, predicting the cluster's other "
              "runs each time. `held out <=10%` is the share of the held-out runs within 10% of their "
              "measured time: its median over the choices, and the worst and best choice. `all <=10%` counts "
              "the choices after which every held-out run is within 10%. `hardest run to fit on`: the run "
              "whose choices (the fits that include it) leave the lowest median share. The last column names "
              "the runs that no choice brings within 10%: what a compute scale cannot correct.\n")
    md.append("| cluster | fitted on | choices | held out | held out <=10%: median | worst | best | "
              "all <=10% | median held-out MAE | hardest run to fit on (median <=10% of its choices) | "
              "held out beyond 10% after every choice |")
    md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    med = statistics.median
    for name, f, doc, dev, path in choice_groups:
        for k in (1, 2):
            mine = [(job, e, x) for job, e, x in choice_results if job[0] == name and job[1] == k]
            res = [(job, e) for job, e, _ in mine if e is not None]
            refused = [x for _, e, x in mine if e is None]
            # Runs held out by some choice and within 10% after none.
            held = {r["label"] for job, _ in res for r in doc["runs"] if r["label"] not in job[2]}
            never = sorted(held - set().union(*(x for _, e, x in mine if e is not None)))
            if not res:
                continue
            share = lambda e: sum(abs(x) <= 0.10 for x in e) / len(e)
            shares = [share(e) for _, e in res]
            maes = [sum(abs(x) for x in e) / len(e) for _, e in res]
            per_run = {}
            for job, e in res:
                for lab in job[2]:
                    per_run.setdefault(lab, []).append(share(e))
            hard = min(per_run, key=lambda l: (med(per_run[l]), l))
            n_ho = len(res[0][1])
            md.append(f"| {name} | {k} | {len(res)}" + (f" ({len(refused)} refused)" if refused else "") +
                      f" | {n_ho} | {100 * med(shares):.0f}% | {100 * min(shares):.0f}% | "
                      f"{100 * max(shares):.0f}% | {sum(s_ == 1.0 for s_ in shares)}/{len(res)} | "
                      f"{100 * med(maes):.1f}% | {hard} ({100 * med(per_run[hard]):.0f}%) | "
                      f"{', '.join(never) if never else 'none'} |")
    md.append("\n## 3. Sensitivity of the assumptions (uncalibrated, own preset + the change)\n")
    md.append("| variant | runs | MAE | rms log | <=10% |")
    md.append("|---|---:|---:|---:|---:|")
    for name, f, rows in vres:
        mae, rms, w10 = stats([err(r["before_s"], r["measured_s"]) for r in rows.values()])
        md.append(f"| {name} | {len(rows)} | {mae} | {rms} | {w10} |")

    fpath = os.path.join(HERE, "findings.md")
    if os.path.exists(fpath):
        md.append("\n" + open(fpath).read().strip() + "\n")
    md.append("\n## 4. Per run\n")
    for f in FILES:
        md.append(f"\n### {f}\n")
        md.append("| run | split | measured s | own preset s | err | " + " | ".join(PRESETS) +
                  " | held out after fit | meas GiB | pred GiB | err GiB |")
        md.append("|---|---|---:|---:|---:|" + "---:|" * len(PRESETS) + "---:|---:|---:|---:|")
        after = {r["label"]: r for r in csv_rows if r["phase"] == "after-fit" and r["file"] == f
                 and r["fitted_on"] == "held-out" and r.get("preset") == "own"}
        for lab, r in own[f].items():
            cells = [fmt_err(err(allp[(f, p)][lab]["before_s"], r["measured_s"])) for p in PRESETS]
            af = after.get(lab)
            afs = fmt_err(err(af["predicted_s"], af["measured_s"])) if af else "(fitted)"
            mg = "-" if r["measured_gib"] is None else f"{r['measured_gib']:.1f}"
            pg = "-" if r["before_gib"] is None else f"{r['before_gib']:.1f}" + ("" if r["fits"] else " (OOM)")
            md.append(f"| {lab} | {split[f][lab]} | {r['measured_s']:.3f} | {r['before_s']:.3f} | "
                      f"{fmt_err(err(r['before_s'], r['measured_s']))} | " + " | ".join(cells) +
                      f" | {afs} | {mg} | {pg} | {fmt_err(err(r['before_gib'], r['measured_gib']))} |")

    md.append("\n## Commands\n")
    md.append("Binary: `build/planner_service/cli/arachne` (built with `/tmp/bld arachne`). "
              "`--fit compute_scale` in the uncalibrated passes only keeps the fit from refusing; "
              "the tables use its `before` columns (no corrections). `<...>` are the temporary "
              "files the script writes (the runs file with one field changed).\n")
    md.append("```sh\n/usr/bin/python3 bench/published-runs/derive_published_runs.py\n"
              "/usr/bin/python3 bench/published-runs/compare_runs.py\n"
              "/usr/bin/python3 bench/measured_runs_plot.py\n```\n")
    md.append("Every `arachne calibrate` the script ran:\n")
    md.append("```")
    md.extend(COMMANDS)
    md.append("```")
    with open(os.path.join(RESULTS, "measured_runs.md"), "w") as fh:
        fh.write("\n".join(md) + "\n")
    print("wrote", rel(os.path.join(RESULTS, "measured_runs.csv")), "and",
          rel(os.path.join(RESULTS, "measured_runs.md")))


if __name__ == "__main__":
    main()
