"""`python3 -m arachne_torch.engine` as the agent runs it: a process
serving arachne.v1.Engine on a Unix socket, driven here over that socket
(one GPU, its layout the whole state)."""

import ctypes
import datetime
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
import torch.distributed as dist

from arachne.v1 import agent_pb2, engine_pb2, engine_pb2_grpc
from arachne_torch import state as st
from arachne_torch.job import Job, Model, Plan
from arachne_torch.layout import Layout
from arachne_torch.trainer import Trainer

from conftest import tiny_gpt_proto


def engine_env(sock, **override):
    env = dict(os.environ, ARACHNE_ENGINE_SOCKET=sock, ARACHNE_NODE="n0",
               ARACHNE_GPU_TYPE="A6000", ARACHNE_NODE_GPUS="1", LOCAL_RANK="0",
               ARACHNE_HOST="127.0.0.1", ARACHNE_VIRTUAL_GPUS="1")
    env.update(override)
    return env


@pytest.fixture
def engine(tmp_path):
    sock = str(tmp_path / "e.sock")
    log = open(tmp_path / "engine.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "arachne_torch.engine"],
                         env=engine_env(sock), stderr=log)
    stub = engine_pb2_grpc.EngineStub(grpc.insecure_channel("unix:" + sock))
    stub.Describe(engine_pb2.DescribeRequest(protocol_version=1),
                  wait_for_ready=True, timeout=60)
    yield stub, p
    p.terminate()
    try:
        code = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        # Killed, so that it does not outlive the test (an engine left
        # running spun a core for the rest of a full suite); still a failure.
        p.kill()
        p.wait()
        pytest.fail("the engine did not stop on SIGTERM within 30 s")
    assert code == 0, "the engine did not stop on SIGTERM"


@pytest.fixture(scope="module")
def store():
    s = dist.TCPStore("127.0.0.1", 0, None, True,
                      datetime.timedelta(seconds=30), False)
    yield s


def prepare(generation, store, checkpoint_dir=""):
    r = agent_pb2.PrepareRequest(generation=generation,
                                 store_address=f"127.0.0.1:{store.port}",
                                 checkpoint_dir=checkpoint_dir)
    r.model_spec.CopyFrom(tiny_gpt_proto())
    r.training.seq_len, r.training.global_batch = 32, 16
    r.engine.learning_rate, r.engine.data_seed = 1e-3, 7
    r.engine.init_seed = 11
    n = r.cluster.nodes.add()
    n.name, n.gpu, n.gpus = "n0", "A6000", 1
    t = r.plan.templates.add()
    t.replicas, t.micro_batch_size, t.total_micro_batches = 1, 4, 4
    s = t.stages.add()
    s.tp, s.gpu_type = 1, "A6000"
    s.layers.extend([0, 4])
    t.placement.add().stages.add(node="n0", gpus=[0])
    rank = r.layout.ranks.add()
    rank.gpu.node, rank.gpu.index = "n0", 0
    for i, x in enumerate(st.model_state(Model.from_proto(r.model_spec))):
        rank.holdings.add(tensor=i, begin=0, end=x.bytes)
    return r


def one_rank_trainer(r):
    """The Trainer of plan rank 0 of `r` (a one-GPU plan), in this
    process."""
    job = Job.from_request(r)
    plan = Plan.from_proto(r.plan, job)
    tensors = st.model_state(job.model)
    layout = Layout.from_proto(r.layout, plan, tensors)
    return Trainer(job, plan, tensors, layout, 0, r.generation,
                   r.store_address)


def train_until(stub, n):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = stub.Status(agent_pb2.StatusRequest(), timeout=10)
        assert s.ranks[0].error == ""
        if s.iteration >= n and s.phase == agent_pb2.PHASE_RUNNING and \
                s.ranks[0].iteration >= n:
            return s
        time.sleep(0.02)
    raise AssertionError(f"iteration {n} not reached")


def code_and_message(call, request):
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=60)
    return e.value.code(), e.value.details()


def test_describe_answers_its_version_device_and_the_jobs_state(engine):
    stub, p = engine
    d = stub.Describe(engine_pb2.DescribeRequest(protocol_version=1))
    assert (d.protocol_version, d.engine, d.node, d.local_rank, d.node_gpus,
            d.device, d.pid) == (1, "arachne_torch (PyTorch engine)", "n0", 0,
                                 1, "cpu", p.pid)
    assert d.memory_used_bytes > 0 and d.memory_free_bytes > 0
    assert len(d.tensors) == 0
    req = engine_pb2.DescribeRequest(protocol_version=1)
    req.model_spec.CopyFrom(tiny_gpt_proto())
    d = stub.Describe(req)
    assert len(d.tensors) == 157
    assert sum(t.bytes_per_element * _elements(t.shape) for t in d.tensors) \
        == 10108736
    assert (d.tensors[1].name, d.tensors[1].kind,
            d.tensors[1].bytes_per_element) == ("embedding.weight:master",
                                                "master", 4)


def _elements(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def test_another_protocol_version_is_refused_naming_both(engine):
    stub, _ = engine
    for v in (0, 2):
        assert code_and_message(
            stub.Describe, engine_pb2.DescribeRequest(protocol_version=v)) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            f"protocol_version: the caller speaks engine protocol version "
            f"{v}, this engine (arachne_torch) speaks 1")


def test_every_phase_in_order_trains_checkpoints_and_restores(engine, store,
                                                             tmp_path):
    stub, _ = engine
    stub.Prepare(prepare(1, store), timeout=60)
    stub.Rebuild(agent_pb2.RebuildRequest(generation=1), timeout=60)
    stub.Commit(agent_pb2.CommitRequest(generation=1), timeout=60)
    stub.Resume(agent_pb2.ResumeRequest(generation=1, run_until=2))
    s = train_until(stub, 2)
    # tiny-gpt's second loss under this job, as the reference engine
    # computes it (and this engine, bit for bit).
    assert s.current_generation == 1 and s.ranks[0].in_plan
    assert s.ranks[0].state_bytes == 10108736
    first = s.loss
    ckpt = str(tmp_path / "ckpt")
    stub.SaveCheckpoint(agent_pb2.SaveCheckpointRequest(generation=1,
                                                        dir=ckpt))
    assert os.listdir(ckpt) == ["shard-n0-0.bin"]
    # Generation 2 restores it (a plan change through a checkpoint).
    r = prepare(2, store, checkpoint_dir=ckpt)
    r.old_plan.CopyFrom(r.plan)
    r.old_cluster.CopyFrom(r.cluster)
    stub.Prepare(r, timeout=60)
    assert stub.Pause(agent_pb2.PauseRequest(generation=2)).iteration == 2
    for stage in (1, 2):
        stub.Migrate(agent_pb2.MigrateRequest(generation=2, stage=stage))
    stub.Rebuild(agent_pb2.RebuildRequest(generation=2), timeout=60)
    stub.Commit(agent_pb2.CommitRequest(generation=2))
    s = stub.Status(agent_pb2.StatusRequest())
    assert (s.current_generation, s.iteration) == (2, 2)
    # The switch's memory (RankStatus.switch_*): this process's RSS when
    # Prepare began and its peak since, which holds both states (10 MB each)
    # at most; the lifetime peak is at least the switch's.
    r = s.ranks[0]
    assert r.switch_start_rss_bytes > 0
    assert r.switch_start_rss_bytes <= r.switch_peak_rss_bytes
    assert r.switch_peak_rss_bytes <= r.peak_rss_bytes
    stub.Resume(agent_pb2.ResumeRequest(generation=2, run_until=3))
    s = train_until(stub, 3)
    assert s.loss < first


def test_out_of_order_and_stale_calls_are_refused_with_their_code(engine,
                                                                  store):
    stub, _ = engine
    fp = grpc.StatusCode.FAILED_PRECONDITION
    assert code_and_message(stub.Pause, agent_pb2.PauseRequest(
        generation=1)) == (
        fp, "generation 1 is not prepared on node n0 (current 0, prepared 0)")
    assert code_and_message(stub.Resume, agent_pb2.ResumeRequest(
        generation=1)) == (fp, "generation 1 is not current on node n0 "
                               "(current 0)")
    stub.Prepare(prepare(1, store), timeout=60)
    assert code_and_message(stub.Commit, agent_pb2.CommitRequest(
        generation=1)) == (fp, "node n0: generation 1 is not rebuilt (phase "
                               "prepared)")
    assert code_and_message(stub.Prepare, prepare(2, store)) == (
        fp, "generation 1 is being prepared on node n0; abort it before "
            "preparing generation 2")
    stub.Rebuild(agent_pb2.RebuildRequest(generation=1), timeout=60)
    stub.Commit(agent_pb2.CommitRequest(generation=1))
    assert code_and_message(stub.Prepare, prepare(1, store)) == (
        fp, "generation 1 is not newer than node n0's current generation 1 "
            "(last aborted 0)")
    assert code_and_message(stub.Migrate, agent_pb2.MigrateRequest(
        generation=1, stage=3)) == (grpc.StatusCode.INVALID_ARGUMENT,
                                    "stage: must be 1 or 2, got 3")
    bad = prepare(2, store, checkpoint_dir="/nonexistent")
    bad.plan.templates[0].stages[0].tp = 3
    assert code_and_message(stub.Prepare, bad) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "plan.templates[0].stages[0].tp: 3 does not divide the model's "
        "num_heads (8)")


@pytest.mark.parametrize("override,message", [
    ({"LOCAL_RANK": "2"}, "LOCAL_RANK: must be an integer in 0..0, got \"2\""),
    ({"ARACHNE_NODE": ""}, "ARACHNE_NODE: required, got none"),
    ({"ARACHNE_VIRTUAL_GPUS": "yes"},
     "ARACHNE_VIRTUAL_GPUS: must be 0 or 1, got \"yes\""),
    ({"ARACHNE_VIRTUAL_GPU_SPEED": "0"},
     "ARACHNE_VIRTUAL_GPU_SPEED: must be a number in (0, 1], got \"0\""),
    ({"ARACHNE_VIRTUAL_GPU_SPEED": "fast"},
     "ARACHNE_VIRTUAL_GPU_SPEED: must be a number in (0, 1], got \"fast\""),
    ({"ARACHNE_VIRTUAL_GPU_SPEED": "0.5", "ARACHNE_VIRTUAL_GPUS": "0"},
     "ARACHNE_VIRTUAL_GPU_SPEED: only with ARACHNE_VIRTUAL_GPUS=1, got "
     "\"0.5\""),
])
def test_a_bad_launch_environment_exits_2_naming_the_variable(
        tmp_path, override, message):
    p = subprocess.run([sys.executable, "-m", "arachne_torch.engine"],
                       env=engine_env(str(tmp_path / "e.sock"), **override),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == f"arachne_torch.engine: {message}"


def test_a_virtual_gpu_holds_each_step_to_its_cpu_time_over_the_speed():
    """ComputePacer on injected clocks: 30 ms of CPU in 30 ms at speed 0.25
    sleeps 90 ms (120 ms in all); the same step stretched to 50 ms by other
    processes sleeps 70 ms (the stretch is not scaled again); speed 1 never
    sleeps or reads a clock."""
    from arachne_torch.trainer import ComputePacer
    wall, cpu = [100.0], [7.0]
    waits = []
    pacer = ComputePacer(0.25, clock=lambda: wall[0],
                         cpu_clock=lambda: cpu[0], sleep=waits.append)
    start = pacer.start()
    wall[0] += 0.030
    cpu[0] += 0.030
    assert pacer.pace(start) == pytest.approx(0.090)
    start = pacer.start()
    wall[0] += 0.050
    cpu[0] += 0.030
    assert pacer.pace(start) == pytest.approx(0.070)
    assert waits == [pytest.approx(0.090), pytest.approx(0.070)]
    assert pacer.wait_after(0.030, 0.200) == 0.0
    full = ComputePacer(1.0, clock=lambda: 1 / 0, cpu_clock=lambda: 1 / 0,
                        sleep=waits.append)
    assert full.pace(full.start()) == 0.0
    assert len(waits) == 2
    with pytest.raises(ValueError, match=r"must be in \(0, 1\], got 1.5"):
        ComputePacer(1.5)


def test_sigterm_to_any_thread_stops_the_engine(tmp_path):
    # The kernel may deliver SIGTERM to any thread that does not block it;
    # sent to a gRPC or c10d thread, the engine used to keep waiting (its
    # main thread never ran the handler). glibc's tgkill picks the thread.
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "tgkill"):
        pytest.skip("no tgkill in this C library")
    sock = str(tmp_path / "e.sock")
    p = subprocess.Popen([sys.executable, "-m", "arachne_torch.engine"],
                         env=engine_env(sock),
                         stderr=open(tmp_path / "engine.log", "w"))
    try:
        # The line the engine prints once it handles the signals.
        for _ in range(600):
            if "serving arachne.v1.Engine" in (tmp_path / "engine.log").read_text():
                break
            assert p.poll() is None, (tmp_path / "engine.log").read_text()
            time.sleep(0.1)
        else:
            pytest.fail("the engine did not start within 60 s")

        def takes_sigterm(tid):
            with open(f"/proc/{p.pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("SigBlk:"):
                        return not (int(line.split()[1], 16) >> 14) & 1
            return False

        others = sorted(int(t) for t in os.listdir(f"/proc/{p.pid}/task")
                        if int(t) != p.pid and takes_sigterm(t))
        assert others, "the engine runs no thread besides the main one"
        assert libc.tgkill(p.pid, others[-1], signal.SIGTERM) == 0
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
