"""Device and precision (arachne_torch.device): the device chosen from the
agent's environment and CUDA's answer (a pure function, fed fake inputs
here), the precision from the job and the engine option with every refusal
worded exactly, bf16 training on the CPU and the fp16 loss scale's
bookkeeping, the canonical byte view through host memory (as on a CUDA
device), and `python3 -m arachne_torch.gpu_check --cpu`. The tests marked
`cuda` need a CUDA device and skip without one."""

import json
import subprocess
import sys

import grpc
import numpy as np
import pytest
import torch

from arachne_torch import device as dev
from arachne_torch import migration as mig
from arachne_torch import state as st
from arachne_torch.device import DeviceChoice, LossScale
from arachne_torch.job import BadRequest, Job, Plan
from arachne_torch.layout import Layout
from arachne_torch.trainer import Trainer, _all_gather, _all_reduce, gloo_group

from test_engine_process import (code_and_message, engine,  # noqa: F401
                                 engine_env, prepare, store)
from test_migration import canonical_bytes, fake_trainer

cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="needs a CUDA device")
CPU = DeviceChoice("cpu", "ARACHNE_VIRTUAL_GPUS=1")
GPU = DeviceChoice("cuda:0", "CUDA device 0")


# -- the device ---------------------------------------------------------------

@pytest.mark.parametrize("args,device", [
    # (virtual_gpus, local_rank, CUDA_VISIBLE_DEVICES, available, count,
    #  ARACHNE_TORCH_DEVICE)
    ((True, 0, None, True, 1, "auto"), "cpu"),
    ((True, 1, None, False, 0, "cpu"), "cpu"),
    ((False, 3, "3", True, 8, "cpu"), "cpu"),
    # The agent's launch: CUDA_VISIBLE_DEVICES=LOCAL_RANK, one visible.
    ((False, 3, "3", True, 1, "auto"), "cuda:0"),
    ((False, 3, "3", True, 1, "cuda"), "cuda:0"),
    # Several visible (torchrun-style): LOCAL_RANK picks.
    ((False, 2, None, True, 4, "auto"), "cuda:2"),
    ((False, 1, "4,5", True, 2, "auto"), "cuda:1"),
    # No CUDA (a CPU-only PyTorch): the CPU.
    ((False, 0, "0", False, 0, "auto"), "cpu"),
])
def test_the_device_follows_the_agent_and_cuda(args, device):
    assert dev.select_device(*args).device == device


def test_the_reason_for_the_device_is_given():
    assert dev.select_device(False, 0, "0", False, 0).why == (
        "ARACHNE_VIRTUAL_GPUS=0 but no CUDA device is available "
        f"(CUDA_VISIBLE_DEVICES \"0\", torch {torch.__version__}): training "
        "on the CPU")
    assert dev.select_device(False, 1, None, True, 2).why == (
        "LOCAL_RANK 1, CUDA_VISIBLE_DEVICES unset: CUDA device 1 of 2 "
        "visible")


@pytest.mark.parametrize("args,message", [
    ((False, 3, "0,1", True, 2, "auto"),
     "LOCAL_RANK: 3, but only 2 CUDA devices are visible "
     "(CUDA_VISIBLE_DEVICES \"0,1\")"),
    ((False, 0, None, False, 0, "cuda"),
     f"ARACHNE_TORCH_DEVICE: \"cuda\", but torch {torch.__version__} sees no "
     "CUDA device (CUDA_VISIBLE_DEVICES unset, torch.cuda.is_available() "
     "False)"),
    ((True, 0, None, True, 1, "cuda"),
     "ARACHNE_TORCH_DEVICE: \"cuda\" with ARACHNE_VIRTUAL_GPUS=1 (the agent "
     "runs CPU ranks standing in for GPUs); start the agent without "
     "--virtual-gpus to train on CUDA devices"),
])
def test_a_device_that_cannot_be_had_is_refused(args, message):
    with pytest.raises(BadRequest) as e:
        dev.select_device(*args)
    assert str(e.value) == message


def test_the_engine_options_are_read_and_checked():
    assert dev.device_option({}) == "auto"
    assert dev.device_option({"ARACHNE_TORCH_DEVICE": ""}) == "auto"
    assert dev.device_option({"ARACHNE_TORCH_DEVICE": "cpu"}) == "cpu"
    assert dev.precision_option({"ARACHNE_TORCH_PRECISION": "bf16"}) == \
        "bf16"
    with pytest.raises(BadRequest) as e:
        dev.device_option({"ARACHNE_TORCH_DEVICE": "gpu"})
    assert str(e.value) == ("ARACHNE_TORCH_DEVICE: must be one of auto, cpu, "
                            "cuda, got \"gpu\"")
    with pytest.raises(BadRequest) as e:
        dev.precision_option({"ARACHNE_TORCH_PRECISION": "fp8"})
    assert str(e.value) == ("ARACHNE_TORCH_PRECISION: must be one of auto, "
                            "fp32, bf16, fp16, got \"fp8\"")


# -- the precision ------------------------------------------------------------

@pytest.mark.parametrize("device,job,option,precision", [
    (CPU, "bf16", "auto", "fp32"),   # the agent always sends one
    (CPU, "fp16", "auto", "fp32"),
    (CPU, "", "auto", "fp32"),
    (CPU, "bf16", "bf16", "bf16"),   # on request
    (CPU, "bf16", "fp32", "fp32"),
    (GPU, "", "auto", "bf16"),       # the planner's default
    (GPU, "bf16", "auto", "bf16"),
    (GPU, "fp16", "auto", "fp16"),
    (GPU, "bf16", "fp32", "fp32"),   # e.g. to compare with fp32 runs
    (GPU, "bf16", "fp16", "fp16"),
])
def test_the_precision_is_the_jobs_on_cuda_and_fp32_on_the_cpu(
        device, job, option, precision):
    assert dev.resolve_precision(device, job, option) == precision


@pytest.mark.parametrize("device", [CPU, GPU])
def test_a_bad_job_precision_is_refused_naming_the_field(device):
    with pytest.raises(BadRequest) as e:
        dev.resolve_precision(device, "fp8")
    assert str(e.value) == ("training.precision: must be \"bf16\" or "
                            "\"fp16\", got \"fp8\"")


def test_fp16_on_the_cpu_is_refused_naming_the_option():
    with pytest.raises(BadRequest) as e:
        dev.resolve_precision(CPU, "bf16", "fp16")
    assert str(e.value) == (
        "ARACHNE_TORCH_PRECISION: \"fp16\" needs a CUDA device; this engine "
        "trains on the CPU (ARACHNE_VIRTUAL_GPUS=1), where the choices are "
        "fp32 (the default) and bf16")


@pytest.mark.parametrize("override,message", [
    ({"ARACHNE_TORCH_PRECISION": "fp16"},
     "ARACHNE_TORCH_PRECISION: \"fp16\" needs a CUDA device; this engine "
     "trains on the CPU (ARACHNE_VIRTUAL_GPUS=1 (a CPU rank standing in for "
     "a GPU)), where the choices are fp32 (the default) and bf16"),
    ({"ARACHNE_TORCH_PRECISION": "half"},
     "ARACHNE_TORCH_PRECISION: must be one of auto, fp32, bf16, fp16, got "
     "\"half\""),
    ({"ARACHNE_TORCH_DEVICE": "cuda"},
     "ARACHNE_TORCH_DEVICE: \"cuda\" with ARACHNE_VIRTUAL_GPUS=1 (the agent "
     "runs CPU ranks standing in for GPUs); start the agent without "
     "--virtual-gpus to train on CUDA devices"),
])
def test_a_bad_engine_option_exits_2_naming_it(tmp_path, override, message):
    p = subprocess.run([sys.executable, "-m", "arachne_torch.engine"],
                       env=engine_env(str(tmp_path / "e.sock"), **override),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == f"arachne_torch.engine: {message}"


def test_prepare_refuses_a_bad_training_precision(engine, store):
    stub, _ = engine
    r = prepare(1, store)
    r.training.precision = "fp8"
    assert code_and_message(stub.Prepare, r) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "training.precision: must be \"bf16\" or \"fp16\", got \"fp8\"")


# -- training in bf16 and fp16 ------------------------------------------------

def trainer_of(r, **kw):
    job = Job.from_request(r)
    plan = Plan.from_proto(r.plan, job)
    tensors = st.model_state(job.model)
    layout = Layout.from_proto(r.layout, plan, tensors)
    return Trainer(job, plan, tensors, layout, 0, r.generation,
                   r.store_address, **kw)


def weights_are_master_roundings(t):
    return all(torch.equal(p.weight, p.master.detach().to(torch.bfloat16))
               for p in t.params)


def test_bf16_on_the_cpu_follows_fp32_closely_on_the_same_state(store):
    fp32 = trainer_of(prepare(21, store))
    bf16 = trainer_of(prepare(22, store), precision="bf16")
    a = [fp32.run_iteration().loss for _ in range(4)]
    b = [bf16.run_iteration().loss for _ in range(4)]
    assert a != b  # the matrix multiplies did run in bf16
    assert b == pytest.approx(a, rel=1e-3)
    assert all(y < x for x, y in zip(b, b[1:])), b
    # The state keeps its layout: fp32 masters and moments, the bf16 weight
    # their rounding.
    for p in bf16.params:
        assert (p.master.dtype, p.adam_m.dtype, p.adam_v.dtype,
                p.weight.dtype) == (torch.float32,) * 3 + (torch.bfloat16,)
    assert weights_are_master_roundings(bf16)
    assert sorted(bf16.save_state()) == sorted(fp32.save_state())
    assert bf16.scalars == fp32.scalars


def test_a_bf16_state_saved_and_loaded_is_bitwise(store):
    t = trainer_of(prepare(23, store), precision="bf16")
    for _ in range(2):
        t.run_iteration()
    saved = t.save_state()
    fresh = trainer_of(prepare(24, store), precision="bf16", initialize=False)
    fresh.load_state(saved)
    assert fresh.save_state() == saved
    assert fresh.run_iteration().loss == t.run_iteration().loss


def test_the_fp16_loss_scale_lives_in_the_scalars_and_halves_on_overflow(
        store, monkeypatch):
    # The CPU has no fp16 matrix multiply: the fp16 bookkeeping runs here
    # with bf16 compute (the scale is a power of two: exact in either).
    t = trainer_of(prepare(25, store), precision="fp16")
    t.dtype = torch.bfloat16
    ref = trainer_of(prepare(26, store), precision="bf16")
    assert t.scalars[st.SCALAR_LOSS_SCALE] == (16 + 1024) << 32
    assert t.loss_scale == LossScale(16, 0)
    first = t.run_iteration()
    assert first.loss == ref.run_iteration().loss and not first.skipped
    assert t.loss_scale == LossScale(16, 1)
    before = t.save_state()
    monkeypatch.setattr(t, "_gradients_finite", lambda: False)
    r = t.run_iteration()
    assert r.skipped and r.iteration == 2
    assert t.loss_scale == LossScale(15, 0)
    after = t.save_state()
    # Skipped: every tensor as it was; the step and the cursor moved on.
    sid = t.scalars_id
    assert {k: v for k, v in after.items() if k[0] != sid} == \
        {k: v for k, v in before.items() if k[0] != sid}
    assert t.scalars[st.SCALAR_STEP] == 2
    assert t.scalars[st.SCALAR_CURSOR] == 2 * 16
    # The scale travels with the state (a checkpoint, a migration).
    fresh = trainer_of(prepare(27, store), precision="fp16",
                       initialize=False)
    fresh.load_state(after)
    assert fresh.loss_scale == LossScale(15, 0)


def test_the_loss_scale_slot_is_read_back_or_refused():
    assert LossScale.decode(0) == LossScale(16, 0)
    for s in (LossScale(16, 0), LossScale(-24, 1999), LossScale(24, 7)):
        assert LossScale.decode(s.encode()) == s
    assert LossScale(3, 0).scale == 8.0
    s = LossScale(24, 1999)
    s.update(False)
    assert s == LossScale(24, 0)
    s = LossScale(5, 1999)
    s.update(False)
    assert s == LossScale(6, 0)
    with pytest.raises(ValueError, match="is not a loss scale"):
        LossScale.decode(12345)


def test_16_bit_collectives_on_gloo_go_through_fp32(store):
    g = gloo_group(torch.distributed.PrefixStore("bf16-gloo", store), "one",
                   0, 1, torch.distributed.ProcessGroupGloo.create_device(
                       hostname="127.0.0.1"), 30)
    t = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    _all_reduce(g, t)
    assert t.dtype == torch.bfloat16 and t.tolist() == [1.5, -2.25]
    out = _all_gather(g, t, 1)
    assert out[0].dtype == torch.bfloat16 and out[0].tolist() == [1.5, -2.25]


# -- the canonical bytes through host memory ----------------------------------

def test_staged_reads_give_the_canonical_bytes_at_any_offset():
    t = fake_trainer(1)
    view = mig.CanonicalState(t, staged=True)
    assert not mig.CanonicalState(t).staged  # CPU tensors: not staged
    rng = np.random.default_rng(0)
    for tensor in range(len(t.tensors)):
        data, first = canonical_bytes(t, tensor)
        for _ in range(40):
            a, b = sorted(rng.integers(0, len(data) + 1, 2))
            if a == b:
                continue
            seg = mig.Segment(tensor, first + a, first + b)
            assert view.read(seg).numpy().tobytes() == data[a:b], (tensor, a, b)


# -- gpu_check ------------------------------------------------------------------

def gpu_check(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "arachne_torch.gpu_check",
                           *args], capture_output=True, text=True,
                          timeout=timeout)


def test_gpu_check_on_the_cpu_trains_and_reloads_bitwise(tmp_path):
    p = gpu_check("--cpu", "--iterations", "3", "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (s["ok"], s["failures"], s["skipped"], s["device"],
            s["precision"], s["iterations"]) == (True, [], False, "cpu",
                                                 "fp32", 3)
    assert s["model"]["name"] == "tiny-gpt" and \
        s["model"]["parameters"] == 722048
    # tiny-gpt, data seed 7, init seed 11, seq_len 32, global batch 16: the
    # engine tests' job, so its first losses.
    assert s["losses"] == pytest.approx([6.259487, 6.210031, 6.159801],
                                        abs=2e-6)
    assert len(s["iteration_seconds"]) == 3
    assert s["bitwise_reload"] is True and s["mismatched_tensors"] == []
    assert s["weight_is_master_rounding"] is True
    assert s["next_iteration_bitwise"] is True
    assert s["state_bytes"] == 10108736
    assert s["checkpoint_bytes"] > s["state_bytes"]
    assert "max_memory_allocated_bytes" not in s
    assert "iteration 3: loss 6.159801" in p.stdout
    assert p.stdout.splitlines()[-1].startswith("PASS: ")


def test_gpu_check_in_bf16_on_the_cpu(tmp_path):
    p = gpu_check("--cpu", "--precision", "bf16", "--iterations", "3",
                  "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (s["ok"], s["precision"], s["bitwise_reload"]) == (True, "bf16",
                                                              True)
    assert s["losses"] == pytest.approx([6.259487, 6.210031, 6.159801],
                                        rel=1e-3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_gpu_check_without_a_gpu_skips(tmp_path):
    p = gpu_check("--out", str(tmp_path))
    assert p.returncode == 0
    assert p.stdout.startswith("SKIP: no CUDA device")
    s = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (s["ok"], s["skipped"]) == (True, True)


def test_gpu_check_refuses_fp16_on_the_cpu(tmp_path):
    p = gpu_check("--cpu", "--precision", "fp16", "--out", str(tmp_path))
    assert p.returncode == 2
    assert p.stderr.strip().endswith(
        "error: --precision: \"fp16\" needs a CUDA device (with --cpu: fp32 "
        "or bf16)")


# -- on a CUDA device -----------------------------------------------------------

@cuda
def test_gpu_check_on_the_gpu_in_bf16(tmp_path):
    p = gpu_check("--model", "tiny-gpt", "--seq-len", "32", "--iterations",
                  "5", "--out", str(tmp_path), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (s["device"], s["precision"], s["bitwise_reload"]) == \
        ("cuda:0", "bf16", True)
    assert s["max_memory_allocated_bytes"] > s["state_bytes"]
    assert s["losses"] == pytest.approx([6.259487, 6.210031, 6.159801,
                                         6.058122, 5.913031], rel=2e-3)


@cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_follows_the_cpus_fp32_losses(store, precision):
    g = {"fp32": 31, "bf16": 34, "fp16": 37}[precision]  # fresh groups each
    cpu = trainer_of(prepare(g, store))
    gpu = trainer_of(prepare(g + 1, store), device="cuda:0",
                     precision=precision)
    a = [cpu.run_iteration().loss for _ in range(4)]
    b = [gpu.run_iteration().loss for _ in range(4)]
    assert b == pytest.approx(a, rel=1e-5 if precision == "fp32" else 3e-3)
    assert weights_are_master_roundings(gpu)
    saved = gpu.save_state()
    fresh = trainer_of(prepare(g + 2, store), device="cuda:0",
                       precision=precision, initialize=False)
    fresh.load_state(saved)
    assert fresh.save_state() == saved


@cuda
def test_nccl_groups_reduce_on_the_device(store):
    from arachne_torch.trainer import nccl_group
    g = nccl_group(torch.distributed.PrefixStore("nccl", store), "one", 0, 1,
                   30)
    t = torch.tensor([1.0, 2.0], device="cuda:0")
    _all_reduce(g, t)
    assert t.tolist() == [1.0, 2.0]


@cuda
def test_the_engine_describes_its_cuda_device(tmp_path):
    from arachne.v1 import engine_pb2, engine_pb2_grpc
    sock = str(tmp_path / "e.sock")
    p = subprocess.Popen([sys.executable, "-m", "arachne_torch.engine"],
                         env=engine_env(sock, ARACHNE_VIRTUAL_GPUS="0",
                                        CUDA_VISIBLE_DEVICES="0"))
    try:
        stub = engine_pb2_grpc.EngineStub(
            grpc.insecure_channel("unix:" + sock))
        d = stub.Describe(engine_pb2.DescribeRequest(protocol_version=1),
                          wait_for_ready=True, timeout=60)
        assert d.device == "cuda:0"
        assert d.memory_free_bytes > 0
    finally:
        p.terminate()
        p.wait(timeout=30)
