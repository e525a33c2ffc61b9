"""Where an engine computes and in what precision (docs/pytorch.md,
"Device and precision").

The device is chosen once, when the engine starts (`select_device`, a pure
function of what the agent and the machine say): a CPU rank when the agent
runs virtual GPUs (ARACHNE_VIRTUAL_GPUS=1) or ARACHNE_TORCH_DEVICE=cpu
forces it; else the CUDA device of LOCAL_RANK among those
CUDA_VISIBLE_DEVICES leaves visible (the agent leaves exactly one, index 0
in the process), when torch.cuda.is_available().

The precision is the job's `training.precision` ("bf16", the planner's
default, or "fp16") on a CUDA device and fp32 on the CPU, unless the engine
option ARACHNE_TORCH_PRECISION names one (`resolve_precision`). Whatever the
precision, the state keeps its canonical layout: fp32 master weights and
Adam moments, the bf16 "weight" their rounding.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping, Optional, Tuple

import torch

from arachne_torch.job import BadRequest

DEVICE_ENV = "ARACHNE_TORCH_DEVICE"        # auto (default) | cpu | cuda
PRECISION_ENV = "ARACHNE_TORCH_PRECISION"  # auto (default) | fp32 | bf16 | fp16

DEVICE_OPTIONS = ("auto", "cpu", "cuda")
PRECISION_OPTIONS = ("auto", "fp32", "bf16", "fp16")
JOB_PRECISIONS = ("bf16", "fp16")  # planner.proto TrainingConfig.precision

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16,
                  "fp16": torch.float16}


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    device: str  # "cpu" or "cuda:N" (N within the process)
    why: str     # one line, for the engine's log

    @property
    def type(self) -> str:
        return self.device.split(":", 1)[0]

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"


def _option(environ: Mapping[str, str], name: str, allowed) -> str:
    v = environ.get(name)
    if v is None or v == "":
        return "auto"
    if v not in allowed:
        raise BadRequest(f"{name}: must be one of "
                         f"{', '.join(allowed)}, got \"{v[:64]}\"")
    return v


def device_option(environ: Mapping[str, str] = os.environ) -> str:
    return _option(environ, DEVICE_ENV, DEVICE_OPTIONS)


def precision_option(environ: Mapping[str, str] = os.environ) -> str:
    return _option(environ, PRECISION_ENV, PRECISION_OPTIONS)


def select_device(virtual_gpus: bool, local_rank: int,
                  cuda_visible_devices: Optional[str], cuda_available: bool,
                  cuda_device_count: int,
                  requested: str = "auto") -> DeviceChoice:
    """The engine's device. `requested` is ARACHNE_TORCH_DEVICE ("auto",
    "cpu", "cuda"). BadRequest naming the variable when "cuda" is asked for
    and cannot be had, or LOCAL_RANK names no visible device."""
    if requested == "cpu":
        return DeviceChoice("cpu", f"{DEVICE_ENV}=cpu")
    if virtual_gpus:
        if requested == "cuda":
            raise BadRequest(
                f"{DEVICE_ENV}: \"cuda\" with ARACHNE_VIRTUAL_GPUS=1 (the "
                "agent runs CPU ranks standing in for GPUs); start the agent "
                "without --virtual-gpus to train on CUDA devices")
        return DeviceChoice("cpu", "ARACHNE_VIRTUAL_GPUS=1 (a CPU rank "
                            "standing in for a GPU)")
    visible = "unset" if cuda_visible_devices is None else \
        f"\"{cuda_visible_devices}\""
    if not cuda_available or cuda_device_count < 1:
        if requested == "cuda":
            raise BadRequest(
                f"{DEVICE_ENV}: \"cuda\", but torch {torch.__version__} sees "
                f"no CUDA device (CUDA_VISIBLE_DEVICES {visible}, "
                f"torch.cuda.is_available() {cuda_available})")
        return DeviceChoice("cpu", "ARACHNE_VIRTUAL_GPUS=0 but no CUDA "
                            f"device is available (CUDA_VISIBLE_DEVICES "
                            f"{visible}, torch {torch.__version__}): "
                            "training on the CPU")
    # The agent leaves exactly one device visible (CUDA_VISIBLE_DEVICES=
    # LOCAL_RANK): index 0. Started otherwise (several visible), LOCAL_RANK
    # picks among them, as under torchrun.
    index = 0 if cuda_device_count == 1 else local_rank
    if index >= cuda_device_count:
        raise BadRequest(
            f"LOCAL_RANK: {local_rank}, but only {cuda_device_count} CUDA "
            f"devices are visible (CUDA_VISIBLE_DEVICES {visible})")
    return DeviceChoice(f"cuda:{index}",
                        f"LOCAL_RANK {local_rank}, CUDA_VISIBLE_DEVICES "
                        f"{visible}: CUDA device {index} of "
                        f"{cuda_device_count} visible")


def select_device_here(virtual_gpus: bool, local_rank: int,
                       environ: Mapping[str, str] = os.environ
                       ) -> DeviceChoice:
    """select_device with this process's environment and CUDA."""
    requested = device_option(environ)
    available = requested != "cpu" and not virtual_gpus and \
        torch.cuda.is_available()
    return select_device(virtual_gpus, local_rank,
                         environ.get("CUDA_VISIBLE_DEVICES"), available,
                         torch.cuda.device_count() if available else 0,
                         requested)


def check_precision_option(requested: str, device: DeviceChoice) -> None:
    """Refuses an engine precision the device cannot compute in: fp16 on
    the CPU (PyTorch has no CPU fp16 matrix multiply). bf16 on the CPU is
    allowed on request (tested there); its default is fp32."""
    if requested == "fp16" and not device.is_cuda:
        raise BadRequest(
            f"{PRECISION_ENV}: \"fp16\" needs a CUDA device; this engine "
            f"trains on the CPU ({device.why}), where the choices are fp32 "
            "(the default) and bf16")


def job_precision(value: str) -> str:
    """training.precision of the job as the engine reads it: empty is the
    planner's default, bf16."""
    if value == "":
        return "bf16"
    if value not in JOB_PRECISIONS:
        raise BadRequest("training.precision: must be \"bf16\" or \"fp16\", "
                         f"got \"{value[:64]}\"")
    return value


def resolve_precision(device: DeviceChoice, job: str,
                      requested: str = "auto") -> str:
    """The precision a rank computes in: the engine option when it names
    one; else the job's training.precision on a CUDA device, fp32 on the
    CPU (the agent always sends a precision, bf16 by default, which prices
    the plan; a CPU rank standing in for a GPU computes in fp32)."""
    check_precision_option(requested, device)
    if requested != "auto":
        return requested
    if device.is_cuda:
        return job_precision(job)
    job_precision(job)  # still refuse a bad value
    return "fp32"


def memory(device: str) -> Tuple[int, int]:
    """(bytes in use by this engine, bytes free) on `device`: on a CUDA
    device the caching allocator's allocated bytes and the device's free
    memory (cudaMemGetInfo); on the CPU the process's resident set and the
    machine's available memory."""
    if device.startswith("cuda"):
        d = torch.device(device)
        free, _ = torch.cuda.mem_get_info(d)
        return torch.cuda.memory_allocated(d), free
    return resident_bytes(), available_bytes()


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status_kib(key: str) -> int:
    """A "Key:   123 kB" line of /proc/self/status, in bytes; 0 if absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# The process's peak resident set before the current window (a switch)
# began: resetting the kernel's VmHWM for the window must not lose it.
_earlier_peak = 0


def window_peak_resident_bytes() -> int:
    """The kernel's peak resident set (VmHWM) since the last reset."""
    return _status_kib("VmHWM:")


def peak_resident_bytes() -> int:
    """The process's peak resident set since it started."""
    return max(_earlier_peak, window_peak_resident_bytes())


def reset_window_peak() -> None:
    """Starts a new window (as worker_agent/process_memory.h does): VmHWM
    restarts from the current resident set (/proc/self/clear_refs 5)."""
    global _earlier_peak
    _earlier_peak = max(_earlier_peak, window_peak_resident_bytes())
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# -- dynamic loss scaling (fp16) ---------------------------------------------

# The scale lives in the one unused slot of "train_state:scalars"
# (state.SCALAR_LOSS_SCALE), so it migrates and checkpoints with the state:
# 0 = none yet (the initial scale); else (log2(scale) + EXP_BIAS) << 32 |
# the count of good steps since the last change.
EXP_BIAS = 1 << 10
INITIAL_EXP = 16            # 65536, as torch.cuda.amp.GradScaler
MIN_EXP, MAX_EXP = -24, 24
GROWTH_INTERVAL = 2000      # good steps before the scale doubles


@dataclasses.dataclass
class LossScale:
    exp: int = INITIAL_EXP
    good_steps: int = 0

    @property
    def scale(self) -> float:
        return math.ldexp(1.0, self.exp)

    @staticmethod
    def decode(slot: int) -> "LossScale":
        if slot == 0:
            return LossScale()
        exp = (slot >> 32) - EXP_BIAS
        good = slot & 0xFFFFFFFF
        if not (MIN_EXP <= exp <= MAX_EXP and good < GROWTH_INTERVAL):
            raise ValueError(f"LoadState: loss scale slot {slot:#x} is not a "
                             "loss scale (log2 in "
                             f"[{MIN_EXP}, {MAX_EXP}], good steps below "
                             f"{GROWTH_INTERVAL})")
        return LossScale(exp, good)

    def encode(self) -> int:
        return ((self.exp + EXP_BIAS) << 32) | self.good_steps

    def update(self, overflow: bool) -> None:
        """After a step: halve on an overflow (the step is skipped), double
        after GROWTH_INTERVAL good steps in a row."""
        if overflow:
            self.exp = max(MIN_EXP, self.exp - 1)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= GROWTH_INTERVAL:
            self.exp = min(MAX_EXP, self.exp + 1)
            self.good_steps = 0
