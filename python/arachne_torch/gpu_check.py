"""`python3 -m arachne_torch.gpu_check --out DIR`: the PyTorch engine's
self-check on one GPU (scripts/gpu-check runs it; docs/pytorch.md, "Device
and precision").

On the first CUDA device, it trains one rank of the live demo's
LLaMA-shaped model (demo-llama-19m: hidden 512, 6 layers, 8 heads / 4 KV
heads, SwiGLU 1536, vocabulary 256; 19.1 M parameters) for 20 iterations in
bf16 on the synthetic corpus, printing each iteration's loss and time; saves
the rank's canonical state as a checkpoint shard (checkpoint.py's format),
reloads it into a fresh trainer and checks it bit for bit; records
torch.cuda.max_memory_allocated and cudaMemGetInfo; and writes the summary
as DIR/gpu_check.json. Exit status 1 when a check fails (a non-finite loss,
a last loss not below the first, the bf16 weight not the rounding of its
master, the reloaded state not bitwise the saved one), 2 for bad
arguments. Without a CUDA device it prints "SKIP: no CUDA device" and exits
0, unless --cpu runs the same steps on the CPU (fp32 and tiny-gpt, seq_len
32, by default: a few seconds).

It needs torch and numpy only (no gRPC, no generated protos): the trainer is
built in this process over a TCPStore of its own.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import resource
import sys
import time
import traceback
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.distributed as dist

from arachne_torch import checkpoint as ckpt
from arachne_torch import device as dev
from arachne_torch import state as st
from arachne_torch.job import (EngineConfig, Job, Model, Plan, Stage,
                               Template, Training)
from arachne_torch.layout import Holding, Layout, RankLayout
from arachne_torch.trainer import Trainer

SUMMARY = "gpu_check.json"
NODE = "gpu-check"

MODELS = {
    # The live demo's model (examples/jobs/live-demo-torch.yaml).
    "demo-llama-19m": Model("demo-llama-19m", 6, 512, 8, 4, 64, 1536, 256,
                            None),
    # tiny-gpt of profiles/models.yaml (the tests' model).
    "tiny-gpt": Model("tiny-gpt", 4, 128, 8, 4, 16, 256, 512, None),
}


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 -m arachne_torch.gpu_check",
        description="Train one rank on the GPU, save and reload its "
        "canonical state bitwise; the summary goes to DIR/" + SUMMARY)
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--cpu", action="store_true",
                   help="run on the CPU (fp32 unless --precision bf16)")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                   help="default: bf16 on a GPU, fp32 with --cpu")
    p.add_argument("--model", choices=sorted(MODELS),
                   help="default: demo-llama-19m on a GPU, tiny-gpt with "
                   "--cpu")
    p.add_argument("--seq-len", type=int,
                   help="default: 512 on a GPU, 32 with --cpu")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch-size", type=int, default=4)
    a = p.parse_args(argv)

    def bad(flag, value, want):
        p.error(f"{flag}: must be {want}, got {value}")
    if not 1 <= a.iterations <= 10000:
        bad("--iterations", a.iterations, "in 1..10000")
    if a.cpu and a.precision == "fp16":
        p.error("--precision: \"fp16\" needs a CUDA device (with --cpu: fp32 "
                "or bf16)")
    a.model = a.model or ("tiny-gpt" if a.cpu else "demo-llama-19m")
    a.seq_len = a.seq_len or (32 if a.cpu else 512)
    if not 1 <= a.global_batch <= 1 << 16:
        bad("--global-batch", a.global_batch, "in 1..65536")
    if not 1 <= a.seq_len <= 1 << 16:
        bad("--seq-len", a.seq_len, "in 1..65536")
    if not 1 <= a.micro_batch_size <= a.global_batch or \
            a.global_batch % a.micro_batch_size:
        bad("--micro-batch-size", a.micro_batch_size,
            f"a divisor of --global-batch ({a.global_batch})")
    return a


def one_rank_job(model: Model, seq_len: int, global_batch: int,
                 micro_batch_size: int):
    """The job, its one-GPU plan and the layout giving that GPU the whole
    state."""
    job = Job(model, Training(seq_len, global_batch),
              EngineConfig(learning_rate=1e-3, warmup_iterations=4,
                           data_seed=7, init_seed=11))
    plan = Plan((Template(1, micro_batch_size,
                          global_batch // micro_batch_size,
                          (Stage(1, 0, model.num_layers, 1, 1, 1),)),))
    tensors = st.model_state(model)
    layout = Layout([RankLayout(NODE, 0, 0, 0, 0, 0, tuple(
        Holding(i, 0, t.bytes) for i, t in enumerate(tensors)))])
    return job, plan, tensors, layout


def parameters(model: Model) -> int:
    return sum(t.elements for t in st.model_state(model) if t.kind == "master")


def compare(a: Dict[Tuple[int, int, int], bytes],
            b: Dict[Tuple[int, int, int], bytes],
            tensors) -> List[str]:
    """The tensors whose pieces differ (or that only one side has)."""
    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            out.append(f"{tensors[key[0]].name} [{key[1]}, {key[2]})")
    return out


def weight_is_master_rounding(trainer: Trainer) -> bool:
    with torch.no_grad():
        return all(torch.equal(p.weight, p.master.detach().to(torch.bfloat16))
                   for p in trainer.params)


def run(a: argparse.Namespace) -> int:
    os.makedirs(a.out, exist_ok=True)
    summary_path = os.path.join(a.out, SUMMARY)
    summary: Dict[str, object] = {"ok": False, "failures": []}
    failures: List[str] = summary["failures"]

    def write():
        with open(summary_path, "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")

    if not a.cpu and not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch "
              f"{torch.__version__}, CUDA_VISIBLE_DEVICES "
              f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        summary.update(ok=True, skipped=True, reason="no CUDA device")
        write()
        return 0
    device = "cpu" if a.cpu else "cuda:0"
    precision = a.precision or ("fp32" if a.cpu else "bf16")
    model = MODELS[a.model]
    summary.update(
        skipped=False, device=device, precision=precision,
        torch=torch.__version__, cuda=torch.version.cuda,
        device_name=(torch.cuda.get_device_name(0) if not a.cpu else "cpu"),
        model={"name": model.name, "parameters": parameters(model),
               "num_layers": model.num_layers, "hidden": model.hidden,
               "num_heads": model.num_heads,
               "num_kv_heads": model.num_kv_heads, "ffn": model.ffn,
               "vocab": model.vocab},
        seq_len=a.seq_len, global_batch=a.global_batch,
        micro_batch_size=a.micro_batch_size, iterations=a.iterations)
    print(f"gpu_check: {model.name} ({parameters(model) / 1e6:.1f} M "
          f"parameters) on {device} ({summary['device_name']}) in "
          f"{precision}, seq_len {a.seq_len}, global batch {a.global_batch} "
          f"in micro-batches of {a.micro_batch_size}, torch "
          f"{torch.__version__}", flush=True)
    started = time.monotonic()
    try:
        store = dist.TCPStore("127.0.0.1", 0, None, True,
                              datetime.timedelta(seconds=60), False)
        address = f"127.0.0.1:{store.port}"
        job, plan, tensors, layout = one_rank_job(
            model, a.seq_len, a.global_batch, a.micro_batch_size)
        if not a.cpu:
            torch.cuda.set_device(0)
            torch.cuda.reset_peak_memory_stats(0)
        t0 = time.monotonic()
        trainer = Trainer(job, plan, tensors, layout, 0, 1, address,
                          device=device, precision=precision)
        summary["build_seconds"] = round(time.monotonic() - t0, 3)
        summary["state_bytes"] = trainer.state_bytes()
        losses, seconds, skipped = [], [], 0
        for _ in range(a.iterations):
            r = trainer.run_iteration()
            losses.append(r.loss)
            seconds.append(r.seconds)
            skipped += r.skipped
            print(f"iteration {r.iteration}: loss {r.loss:.6f}, "
                  f"{r.seconds * 1000:.1f} ms"
                  + (" (step skipped: fp16 overflow)" if r.skipped else ""),
                  flush=True)
        summary.update(losses=losses, iteration_seconds=seconds,
                       skipped_steps=skipped)
        steady = sorted(seconds[1:] or seconds)[len(seconds[1:] or seconds)
                                                // 2]
        summary["median_iteration_seconds"] = steady
        summary["tokens_per_second"] = a.global_batch * a.seq_len / steady
        if not all(math.isfinite(x) for x in losses):
            failures.append(f"a loss is not finite: {losses}")
        elif len(losses) >= 2 and not losses[-1] < losses[0]:
            failures.append(f"the last loss {losses[-1]:.6f} is not below "
                            f"the first {losses[0]:.6f}")
        summary["weight_is_master_rounding"] = weight_is_master_rounding(
            trainer)
        if not summary["weight_is_master_rounding"]:
            failures.append("a bf16 weight is not the rounding of its fp32 "
                            "master")
        if not a.cpu:
            summary["max_memory_allocated_bytes"] = \
                torch.cuda.max_memory_allocated(0)
            free, total = torch.cuda.mem_get_info(0)
            summary["mem_get_info"] = {"free_bytes": free,
                                       "total_bytes": total}

        # Save, reload into a fresh trainer, compare bit for bit.
        t0 = time.monotonic()
        saved = trainer.save_state()
        ckpt_dir = os.path.join(a.out, "checkpoint")
        ckpt.write_shard(ckpt_dir, tensors, NODE, 0, saved)
        summary["save_seconds"] = round(time.monotonic() - t0, 3)
        summary["checkpoint_dir"] = ckpt_dir
        summary["checkpoint_bytes"] = sum(
            os.path.getsize(os.path.join(ckpt_dir, f))
            for f in os.listdir(ckpt_dir))
        t0 = time.monotonic()
        fresh = Trainer(job, plan, tensors, layout, 0, 2, address,
                        initialize=False, device=device, precision=precision)
        full = ckpt.read_checkpoint(ckpt_dir, tensors, model.name)
        fresh.load_state({(h.tensor, h.begin, h.end):
                          bytes(full[h.tensor][h.begin:h.end])
                          for h in fresh.holdings()})
        summary["reload_seconds"] = round(time.monotonic() - t0, 3)
        differ = compare(saved, fresh.save_state(), tensors)
        summary["bitwise_reload"] = not differ
        summary["mismatched_tensors"] = differ[:10]
        if differ:
            failures.append(f"the reloaded state differs from the saved one "
                            f"in {len(differ)} tensors, first "
                            f"{differ[0]}")
        # One more iteration on each (informative: bitwise equal when the
        # device's kernels are deterministic).
        a_next, b_next = trainer.run_iteration(), fresh.run_iteration()
        summary["next_loss_saved"] = a_next.loss
        summary["next_loss_reloaded"] = b_next.loss
        summary["next_iteration_bitwise"] = a_next.loss == b_next.loss and \
            not compare(trainer.save_state(), fresh.save_state(), tensors)
        print(f"saved {summary['checkpoint_bytes']} bytes in "
              f"{summary['save_seconds']} s, reloaded in "
              f"{summary['reload_seconds']} s: bitwise "
              f"{summary['bitwise_reload']}; the next iteration on both: "
              f"loss {a_next.loss:.6f} / {b_next.loss:.6f} (bitwise "
              f"{summary['next_iteration_bitwise']})", flush=True)
    except Exception as e:  # a failure of the check, reported as such
        traceback.print_exc()
        failures.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    summary["peak_rss_bytes"] = \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    summary["seconds"] = round(time.monotonic() - started, 3)
    summary["ok"] = not failures
    write()
    if "max_memory_allocated_bytes" in summary:
        print(f"max_memory_allocated {summary['max_memory_allocated_bytes']}"
              f" bytes, free {summary['mem_get_info']['free_bytes']} of "
              f"{summary['mem_get_info']['total_bytes']} bytes", flush=True)
    for f in failures:
        print(f"FAIL: {f}", flush=True)
    print(f"{'PASS' if not failures else 'FAIL'}: {summary_path} "
          f"({summary['seconds']} s)", flush=True)
    return 0 if not failures else 1


def main(argv=None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
