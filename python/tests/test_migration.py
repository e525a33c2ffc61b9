"""The migration's pieces that need no peers: a rank's share read from the
agent's message with every bad field named, and the canonical byte view of a
trainer's tensors (reads and in-place writes at any byte offset, through the
transposed storage of row-parallel weights)."""

import dataclasses
import types

import numpy as np
import pytest
import torch

from arachne.v1 import agent_pb2, planner_pb2

from arachne_torch import migration as mig
from arachne_torch import state as st
from arachne_torch.job import BadRequest
from arachne_torch.trainer import _Param


def fake_trainer(seed, big=False):
    """Two parameters as a trainer holds them: a row-parallel [6, 10]
    linear whose canonical rows 2..6 (of 10) this rank holds, stored
    transposed as [6, 5], and a replicated norm of 6; then the scalars.
    `big`: the same two, a [300, 2000] linear (rows 150..1750 held, about
    1.9 MB of fp32 a kind) and a norm of 300000 (1.2 MB a kind)."""
    tensors, params = [], []
    g = torch.Generator().manual_seed(seed)

    def add(name, shape, split, rows, cshape):
        ids = []
        for kind in st.PARAM_KINDS:
            ids.append(len(tensors))
            tensors.append(st.StateTensor(f"{name}:{kind}", kind, 0, -1,
                                          shape, split))
        row = int(np.prod(cshape[1:])) if len(cshape) > 1 else 1
        begin, end = rows[0] * row * 4, rows[1] * row * 4
        local = (rows[1] - rows[0],) + tuple(cshape[1:])
        canon = torch.randn(local, generator=g)
        p = _Param(name, split, ids, begin, end, local, None, None, None,
                   None)
        p.master = p.swap(canon).contiguous()
        p.weight = p.master.to(torch.bfloat16)
        p.adam_m = torch.randn(p.master.shape, generator=g)
        p.adam_v = torch.randn(p.master.shape, generator=g)
        params.append(p)

    if big:
        add("down.weight", (300, 2000), "row", (150, 1750), (2000, 300))
        add("norm.weight", (300000,), "replicated", (0, 300000), (300000,))
    else:
        add("down.weight", (6, 10), "row", (2, 7), (10, 6))
        add("norm.weight", (6,), "replicated", (0, 6), (6,))
    tensors.append(st.StateTensor(st.TRAIN_STATE_TENSOR, "scalars", -3, -1,
                                  (st.NUM_SCALARS,), "replicated"))
    return types.SimpleNamespace(params=params, tensors=tensors,
                                 scalars_id=len(tensors) - 1,
                                 scalars=list(range(11, 19)))


def canonical_bytes(trainer, tensor):
    """The bytes this rank holds of `tensor`, in canonical order, and the
    canonical offset of the first."""
    if tensor == trainer.scalars_id:
        return np.asarray(trainer.scalars, dtype="<i8").tobytes(), 0
    for p in trainer.params:
        for k, part in enumerate(p.parts()):
            if p.ids[k] == tensor:
                c = p.swap(part).contiguous()
                if c.dtype == torch.bfloat16:
                    c = c.view(torch.int16)
                return c.numpy().tobytes(), p.kind_range(
                    trainer.tensors[tensor])[0]
    raise KeyError(tensor)


def test_reads_give_the_canonical_bytes_at_any_offset():
    t = fake_trainer(1)
    view = mig.CanonicalState(t)
    rng = np.random.default_rng(0)
    for tensor in range(len(t.tensors)):
        data, first = canonical_bytes(t, tensor)
        for _ in range(40):
            a, b = sorted(rng.integers(0, len(data) + 1, 2))
            if a == b:
                continue
            seg = mig.Segment(tensor, first + a, first + b)
            assert view.holds(seg)
            assert view.read(seg).numpy().tobytes() == data[a:b], (tensor, a, b)


@pytest.mark.parametrize("staged", [None, True])
def test_writes_land_in_place_at_any_offset_and_touch_nothing_else(staged):
    """`staged`: through host buffers, as for CUDA tensors."""
    t = fake_trainer(2)
    view = mig.CanonicalState(t, staged=staged)
    rng = np.random.default_rng(1)
    expected = {i: bytearray(canonical_bytes(t, i)[0])
                for i in range(len(t.tensors))}
    for _ in range(200):
        tensor = int(rng.integers(0, len(t.tensors)))
        _, first = canonical_bytes(t, tensor)
        n = len(expected[tensor])
        a, b = sorted(rng.integers(0, n + 1, 2))
        if a == b:
            continue
        new = rng.integers(0, 256, b - a, dtype=np.uint8)
        view.write(mig.Segment(tensor, first + a, first + b),
                   torch.from_numpy(new.copy()))
        expected[tensor][a:b] = new.tobytes()
    view.commit_scalars()
    for i, want in expected.items():
        assert canonical_bytes(t, i)[0] == bytes(want), t.tensors[i].name


def test_ranges_outside_the_holding_are_not_held():
    t = fake_trainer(3)
    view = mig.CanonicalState(t)
    master = t.params[0].ids[1]
    begin, end = t.params[0].begin, t.params[0].end
    assert view.holds(mig.Segment(master, begin, end))
    assert not view.holds(mig.Segment(master, begin - 4, end))
    assert not view.holds(mig.Segment(master, begin, end + 1))
    assert not view.holds(mig.Segment(len(t.tensors), 0, 4))


def share(**over):
    m = agent_pb2.RankMigration(rank=1, world_size=3, stage1_rounds=2,
                                stage2_rounds=1)
    m.kept.add(tensor=0, begin=0, end=8)
    t = m.stage1.add(round=0, peer=0, send=True)
    t.segments.add(tensor=1, begin=0, end=16)
    t = m.stage1.add(round=1, peer=2, send=False)
    t.segments.add(tensor=1, begin=16, end=32)
    t = m.stage2.add(round=0, peer=2, send=False)
    t.segments.add(tensor=0, begin=8, end=24)
    for k, v in over.items():
        setattr(m, k, v)
    return m


def test_a_share_reads_with_its_byte_counts():
    tensors = fake_trainer(0).tensors
    s = mig.RankMigration.from_proto(share(), tensors, 1, 3)
    assert s.bytes_kept == 8
    assert s.bytes_moved(send=True) == 16
    assert s.bytes_moved(send=False) == 32
    assert [t.round for t in s.stages[1]] == [0, 1]


@pytest.mark.parametrize("edit,cluster_rank,message", [
    (lambda m: None, 0, "migration.rank: this GPU is rank 0 of the cluster, "
                        "got 1"),
    (lambda m: setattr(m, "world_size", 4), 1,
     "migration.world_size: the cluster has 3 GPUs, got 4"),
    (lambda m: setattr(m.stage1[0], "peer", 1), 1,
     "migration.stage1[0].peer: must be another rank in 0..2, got 1"),
    (lambda m: setattr(m.stage1[1], "round", 2), 1,
     "migration.stage1[1].round: must be in 0..1, got 2"),
    (lambda m: setattr(m.stage1[1], "round", 0), 1, None),
    (lambda m: setattr(m.kept[0], "end", 10 ** 9), 1,
     "migration.kept[0]: [0, 1000000000) is not a byte range of "
     "down.weight:weight (120 bytes)"),
    (lambda m: setattr(m.stage2[0].segments[0], "tensor", 99), 1,
     "migration.stage2[0].segments[0].tensor: must be in 0..8, got 99"),
])
def test_bad_shares_are_refused_naming_the_field(edit, cluster_rank,
                                                 message):
    m = share()
    edit(m)
    tensors = fake_trainer(0).tensors
    if message is None:
        # Round 0 now holds a send and a receive: allowed.
        mig.RankMigration.from_proto(m, tensors, cluster_rank, 3)
        return
    with pytest.raises(BadRequest) as e:
        mig.RankMigration.from_proto(m, tensors, cluster_rank, 3)
    assert str(e.value) == message


def test_two_sends_in_one_round_are_refused():
    m = share()
    t = m.stage1.add(round=1, peer=0, send=True)
    t.segments.add(tensor=1, begin=0, end=4)
    m.stage1[1].send = True
    with pytest.raises(BadRequest, match="a second send in round 1"):
        mig.RankMigration.from_proto(m, fake_trainer(0).tensors, 1, 3)


def test_the_cluster_rank_counts_gpus_of_the_nodes_before():
    c = planner_pb2.Cluster()
    for name, gpus in (("a", 2), ("b", 4), ("c", 1)):
        n = c.nodes.add()
        n.name, n.gpus = name, gpus
    assert mig.cluster_rank(c, "b", 3) == 5
    assert mig.cluster_rank(c, "c", 0) == 6
    assert mig.cluster_rank(c, "c", 1) == -1
    assert mig.cluster_rank(c, "d", 0) == -1
    assert mig.cluster_size(c) == 7


# -- two ranks over a real Gloo group (threads of this process) -------------

def zeroed(t):
    for p in t.params:
        for part in p.parts():
            part.zero_()
    t.scalars = [0] * st.NUM_SCALARS
    return t


def whole_share(t, rank, peer, send, cut):
    """Everything `t` holds, in two rounds cut at byte `cut` of the first
    tensor (not on an element boundary)."""
    m = agent_pb2.RankMigration(rank=rank, world_size=2, stage1_rounds=2)
    segs = []
    for i in range(len(t.tensors)):
        data, first = canonical_bytes(t, i)
        segs.append((i, first, first + len(data)))
    i, b, e = segs[0]
    r0 = [(i, b, b + cut)]
    r1 = [(i, b + cut, e)] + segs[1:]
    for r, part in enumerate((r0, r1)):
        x = m.stage1.add(round=r, peer=peer, send=send)
        for i, b, e in part:
            x.segments.add(tensor=i, begin=b, end=e)
    return mig.RankMigration.from_proto(m, t.tensors, rank, 2)


def run_pair(fn0, fn1, timeout_s=20):
    import datetime
    import threading

    import torch.distributed as dist
    server = dist.TCPStore("127.0.0.1", 0, None, True,
                           datetime.timedelta(seconds=30))
    out = [None, None]

    def rank(r, fn):
        try:
            store = dist.PrefixStore("m", dist.TCPStore(
                "127.0.0.1", server.port, None, False,
                datetime.timedelta(seconds=30)))
            from arachne_torch.trainer import gloo_group
            g = gloo_group(store, "world", r, 2,
                           dist.ProcessGroupGloo.create_device(
                               hostname="127.0.0.1"), timeout_s)
            out[r] = fn(g)
        except Exception as e:  # reported to the test
            out[r] = e
    ts = [threading.Thread(target=rank, args=(r, f), name=f"rank{r}")
          for r, f in enumerate((fn0, fn1))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return out


def test_two_ranks_move_a_state_bit_for_bit():
    src, dst = fake_trainer(7), zeroed(fake_trainer(8))
    names = lambda r: f"rank {r}"

    def sender(g):
        return mig.Executor(whole_share(src, 0, 1, True, 37), g,
                            mig.CanonicalState(src), None, src.tensors,
                            names).run_stage(1, 10)

    def receiver(g):
        ex = mig.Executor(whole_share(dst, 1, 0, False, 37), g, None,
                          mig.CanonicalState(dst), dst.tensors, names)
        report = ex.run_stage(1, 10)
        ex.new.commit_scalars()
        return report

    sent, got = run_pair(sender, receiver)
    assert not isinstance(sent, Exception), sent
    assert not isinstance(got, Exception), got
    total = sum(len(canonical_bytes(src, i)[0])
                for i in range(len(src.tensors)))
    assert (sent.rounds, sent.bytes_sent) == (2, total)
    assert (got.rounds, got.bytes_received) == (2, total)
    for i in range(len(src.tensors)):
        assert canonical_bytes(dst, i) == canonical_bytes(src, i), i


def test_a_segment_that_fails_its_checksum_is_data_loss(monkeypatch):
    src, dst = fake_trainer(7), zeroed(fake_trainer(8))
    import threading
    real = mig.Checksum.value
    calls = []

    def wrong_on_the_senders_second(self):
        v = real(self)
        if threading.current_thread().name != "rank0":
            return v
        calls.append(1)
        return v ^ 1 if len(calls) == 2 else v
    # The sender finishes one checksum per segment, in segment order.
    monkeypatch.setattr(mig.Checksum, "value", wrong_on_the_senders_second)
    names = lambda r: f"node x GPU {r}"

    def sender(g):
        return mig.Executor(whole_share(src, 0, 1, True, 37), g,
                            mig.CanonicalState(src), None, src.tensors,
                            names).run_stage(1, 10)

    def receiver(g):
        return mig.Executor(whole_share(dst, 1, 0, False, 37), g, None,
                            mig.CanonicalState(dst), dst.tensors,
                            names).run_stage(1, 10)

    # The sender's second sum is round 1's first segment: tensor 0 (bf16,
    # canonical bytes [24, 84) held) from the cut at its byte 37.
    sent, got = run_pair(sender, receiver)
    assert isinstance(got, mig.MigrationError), got
    assert got.code == "DATA_LOSS"
    assert str(got).startswith(
        "migration stage 1 round 1: receive from rank 0 (node x GPU 0): "
        "down.weight:weight [61, 84) fails its checksum where it landed")


def test_a_peer_that_dies_fails_the_round_as_unavailable():
    dst = zeroed(fake_trainer(8))

    def dies(g):
        return None  # its group closes with it

    def receiver(g):
        return mig.Executor(whole_share(dst, 1, 0, False, 37), g, None,
                            mig.CanonicalState(dst), dst.tensors,
                            lambda r: f"rank {r}").run_stage(1, 10.0)

    _, got = run_pair(dies, receiver, timeout_s=30)
    assert isinstance(got, mig.MigrationError), got
    assert got.code == "UNAVAILABLE", got
    assert str(got).startswith(
        "migration stage 1 round 0: receive from rank 0 (rank 0):"), got


def test_a_peer_that_never_sends_fails_the_round_within_its_timeout():
    import time
    dst = zeroed(fake_trainer(8))

    def silent(g):
        time.sleep(4)  # alive, its group open, sending nothing

    def receiver(g):
        return mig.Executor(whole_share(dst, 1, 0, False, 37), g, None,
                            mig.CanonicalState(dst), dst.tensors,
                            lambda r: f"rank {r}").run_stage(1, 1.0)

    _, got = run_pair(silent, receiver, timeout_s=30)
    assert isinstance(got, mig.MigrationError), got
    assert got.code == "DEADLINE_EXCEEDED", got
    assert str(got).startswith(
        "migration stage 1 round 0: receive from rank 0 (rank 0):"), got


# -- bounded staging: the wire plan and a transfer larger than the staging --

def random_transfer(rng, n, tensors=4, send=True):
    """`n` segments of random sizes (a quarter of them 256 KiB or more, up
    to 3 MiB) at random byte offsets."""
    segs = []
    for _ in range(n):
        size = int(rng.integers(mig.DIRECT_SEGMENT_BYTES, 3 << 20)) \
            if rng.random() < 0.25 else int(rng.integers(1, 200 << 10))
        begin = int(rng.integers(0, 1 << 30))
        segs.append(mig.Segment(int(rng.integers(0, tensors)), begin,
                                begin + size))
    return mig.Transfer(0, 1, send, tuple(segs))


@pytest.mark.parametrize("staging", [1 << 20, 3 << 20, 256 << 20])
def test_the_wire_plan_bounds_every_sub_round_and_both_ends_agree(staging):
    rng = np.random.default_rng(staging)
    half = staging // 2
    for trial in range(30):
        t = random_transfer(rng, int(rng.integers(1, 60)))
        plan = mig.plan_wire(t, staging)
        # The receiver derives the same messages from the same transfer.
        assert plan == mig.plan_wire(dataclasses.replace(t, send=False),
                                     staging)
        msgs = plan.messages
        assert msgs[0] == mig.Message("header", 8)
        assert msgs[-1] == mig.Message("sums", 8 * len(t.segments))
        assert [m.kind for m in msgs].count("header") == 1
        assert [m.kind for m in msgs].count("sums") == 1
        covered = [[] for _ in t.segments]
        for k, sub in enumerate(plan.subrounds):
            assert sub, k
            # What a sub-round copies, at most: half the staging.
            assert plan.staging_bytes(k) <= half
            assert [m.kind for m in sub if m.kind == "pack"] in ([], ["pack"])
            for m in sub:
                assert m.size <= half
                if m.kind == "direct":
                    (p,) = m.pieces
                    s = t.segments[p.segment]
                    assert s.bytes >= mig.DIRECT_SEGMENT_BYTES
                    assert (p.at, p.bytes, m.lead) == \
                        (0, m.size, (s.begin + p.begin) % 8)
                    # Cut only at aligned canonical bytes.
                    assert p.end == s.bytes or (s.begin + p.end) % 8 == 0
                if m.kind == "pack":
                    end = 0
                    for p in m.pieces:
                        s = t.segments[p.segment]
                        assert s.bytes < mig.DIRECT_SEGMENT_BYTES
                        assert (p.begin, p.end) == (0, s.bytes)
                        assert p.at >= end and p.at - end < 8
                        assert (p.at - s.begin) % 8 == 0
                        end = p.at + p.bytes
                    assert end == m.size
                for p in m.pieces:
                    covered[p.segment].append((p.begin, p.end))
        # Every byte of every segment travels once, in order.
        for s, c in zip(t.segments, covered):
            assert c[0][0] == 0 and c[-1][1] == s.bytes
            assert all(a[1] == b[0] for a, b in zip(c, c[1:]))


def test_a_large_segment_is_cut_into_chunks_that_fill_the_sub_rounds():
    staging = 1 << 20
    t = mig.Transfer(0, 1, True, (mig.Segment(0, 3, 3 + (5 << 20) + 5),))
    plan = mig.plan_wire(t, staging)
    sizes = [m.size for m in plan.messages if m.kind == "direct"]
    assert sum(sizes) == (5 << 20) + 5
    assert len(plan.subrounds) == len(sizes) == 11
    assert all(plan.staging_bytes(k) == staging // 2
               for k in range(len(plan.subrounds) - 1))


def test_each_message_has_its_own_tag_across_rounds_and_stages():
    ex = mig.Executor(mig.RankMigration(0, 3, (), {1: (), 2: ()}), None,
                      None, None, [], str, staging_bytes=1 << 20)
    big = (mig.Segment(0, 0, 3 << 20),)
    transfers = [mig.Transfer(0, 1, True, big), mig.Transfer(0, 2, False, big),
                 mig.Transfer(1, 1, True, big), mig.Transfer(1, 1, False, big),
                 mig.Transfer(2, 1, True, big)]
    plans = [mig.plan_wire(t, 1 << 20) for t in transfers]
    n = len(plans[0].messages)
    assert n > 2
    for stage, base in ((1, 0), (2, 1 << 30)):
        assert ex._first_tags(stage, transfers, plans) == \
            [base, base, base + n, base, base + 2 * n]


def test_the_share_takes_the_staging_size_at_prepare(monkeypatch):
    tensors = fake_trainer(0).tensors
    monkeypatch.setenv(mig.STAGING_ENV, "3145728")
    s = mig.RankMigration.from_proto(share(), tensors, 1, 3)
    assert s.staging_bytes == 3 << 20
    assert mig.Executor(s, None, None, None, tensors, str).staging_bytes == \
        3 << 20
    monkeypatch.setenv(mig.STAGING_ENV, "lots")
    with pytest.raises(BadRequest) as e:
        mig.RankMigration.from_proto(share(), tensors, 1, 3)
    assert str(e.value) == ('ARACHNE_TORCH_STAGING_BYTES: must be an integer '
                            'in 1048576..68719476736 (bytes), got "lots"')


def test_the_staging_size_comes_from_the_environment_in_range():
    assert mig.staging_bytes_option({}) == 256 << 20
    assert mig.staging_bytes_option({mig.STAGING_ENV: ""}) == 256 << 20
    assert mig.staging_bytes_option({mig.STAGING_ENV: "1048576"}) == 1 << 20
    assert mig.staging_bytes_option({mig.AGENT_STAGING_ENV: "64"}) == 64 << 20
    assert mig.staging_bytes_option({mig.AGENT_STAGING_ENV: "64",
                                     mig.STAGING_ENV: "2097152"}) == 2 << 20
    for env, message in [
        ({mig.STAGING_ENV: "1048575"},
         'ARACHNE_TORCH_STAGING_BYTES: must be an integer in '
         '1048576..68719476736 (bytes), got "1048575"'),
        ({mig.STAGING_ENV: "256MiB"},
         'ARACHNE_TORCH_STAGING_BYTES: must be an integer in '
         '1048576..68719476736 (bytes), got "256MiB"'),
        ({mig.AGENT_STAGING_ENV: "65537"},
         'ARACHNE_MIGRATION_STAGING_MIB: must be an integer in 1..65536 '
         '(MiB), got "65537"'),
    ]:
        with pytest.raises(BadRequest) as e:
            mig.staging_bytes_option(env)
        assert str(e.value) == message
    with pytest.raises(BadRequest) as e:
        mig.Executor(mig.RankMigration(0, 2, (), {1: (), 2: ()}), None, None,
                     None, [], str, staging_bytes=4096)
    assert str(e.value) == ("staging_bytes: must be an integer in "
                            "1048576..68719476736, got 4096")


def cut_share(t, rank, peer, send, rng, rounds=3):
    """Everything `t` holds in `rounds` rounds, each tensor cut at random
    bytes (not on element boundaries) into small and large segments."""
    m = agent_pb2.RankMigration(rank=rank, world_size=2,
                                stage1_rounds=rounds)
    per_round = [[] for _ in range(rounds)]
    for i in range(len(t.tensors)):
        data, first = canonical_bytes(t, i)
        at = 0
        while at < len(data):
            n = int(rng.integers(1, 100 << 10)) if rng.random() < 0.6 else \
                int(rng.integers(256 << 10, 1500 << 10))
            n = min(n, len(data) - at)
            per_round[int(rng.integers(0, rounds))].append(
                (i, first + at, first + at + n))
            at += n
    for r, segs in enumerate(per_round):
        x = m.stage1.add(round=r, peer=peer, send=send)
        for i, b, e in segs:
            x.segments.add(tensor=i, begin=b, end=e)
    return mig.RankMigration.from_proto(m, t.tensors, rank, 2)


@pytest.fixture
def asked(monkeypatch):
    """The sizes of the staging buffers the executor asks for, in order."""
    sizes = []
    real_get = mig._Staging.get

    def get(self, send, n):
        sizes.append(n)
        return real_get(self, send, n)
    monkeypatch.setattr(mig._Staging, "get", get)
    return sizes


@pytest.mark.parametrize("staged", [False, True])
def test_a_transfer_larger_than_the_staging_moves_bit_for_bit(staged, asked):
    """About 11 MB from rank 0 to rank 1 with 1 MiB of staging: the
    replicated norm straight from tensor to tensor, the transposed weight
    and the packs through the staging, never more than 512 KiB a buffer
    (`staged`: every byte through host buffers, as for CUDA tensors)."""
    staging = 1 << 20
    src, dst = fake_trainer(7, big=True), zeroed(fake_trainer(8, big=True))
    total = sum(len(canonical_bytes(src, i)[0])
                for i in range(len(src.tensors)))
    assert total > 10 * staging
    names = lambda r: f"rank {r}"

    def sender(g):
        share = cut_share(src, 0, 1, True, np.random.default_rng(5))
        return mig.Executor(share, g, mig.CanonicalState(src, staged), None,
                            src.tensors, names, staging).run_stage(1, 30)

    def receiver(g):
        share = cut_share(dst, 1, 0, False, np.random.default_rng(5))
        ex = mig.Executor(share, g, None, mig.CanonicalState(dst, staged),
                          dst.tensors, names, staging)
        report = ex.run_stage(1, 30)
        ex.new.commit_scalars()
        return report

    sent, got = run_pair(sender, receiver)
    assert not isinstance(sent, Exception), sent
    assert not isinstance(got, Exception), got
    assert (sent.rounds, sent.bytes_sent) == (3, total)
    assert (got.rounds, got.bytes_received) == (3, total)
    assert sent.subrounds == got.subrounds > 2 * total // staging
    assert asked and max(asked) <= staging // 2
    assert 0 < sent.staging_peak <= staging // 2
    assert 0 < got.staging_peak <= staging // 2
    for i in range(len(src.tensors)):
        assert canonical_bytes(dst, i) == canonical_bytes(src, i), i


def test_kept_bytes_are_copied_through_bounded_chunks(asked):
    src = fake_trainer(7, big=True)
    kept = []
    for i in range(len(src.tensors)):
        data, first = canonical_bytes(src, i)
        kept += [mig.Segment(i, first, first + 13),
                 mig.Segment(i, first + 13, first + len(data))]
    for staged_old, staged_new in ((False, False), (True, False),
                                   (False, True), (True, True)):
        d = zeroed(fake_trainer(8, big=True))
        ex = mig.Executor(mig.RankMigration(0, 1, tuple(kept),
                                            {1: (), 2: ()}), None,
                          mig.CanonicalState(src, staged_old),
                          mig.CanonicalState(d, staged_new), src.tensors,
                          str, staging_bytes=1 << 20)
        assert ex.copy_kept() == sum(s.bytes for s in kept)
        ex.new.commit_scalars()
        for i in range(len(src.tensors)):
            assert canonical_bytes(d, i) == canonical_bytes(src, i), \
                (staged_old, staged_new, i)
    # Only where neither side is in place, through at most 512 KiB.
    assert asked and max(asked) <= 1 << 19


def test_ranks_with_different_staging_sizes_are_refused():
    src, dst = fake_trainer(7), zeroed(fake_trainer(8))
    names = lambda r: f"rank {r}"

    def sender(g):
        return mig.Executor(whole_share(src, 0, 1, True, 37), g,
                            mig.CanonicalState(src), None, src.tensors,
                            names, 2 << 20).run_stage(1, 3)

    def receiver(g):
        return mig.Executor(whole_share(dst, 1, 0, False, 37), g, None,
                            mig.CanonicalState(dst), dst.tensors,
                            names, 1 << 20).run_stage(1, 3)

    _, got = run_pair(sender, receiver, timeout_s=10)
    assert isinstance(got, mig.MigrationError), got
    assert got.code == "FAILED_PRECONDITION"
    assert str(got) == (
        "migration stage 1 round 0: receive from rank 0 (rank 0): rank 0 "
        "stages 2097152 bytes, this rank 1048576: every engine of a switch "
        "must use the same staging size (ARACHNE_TORCH_STAGING_BYTES or "
        "ARACHNE_MIGRATION_STAGING_MIB)")
