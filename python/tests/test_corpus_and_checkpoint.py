"""The synthetic corpus is the reference engine's, sample for sample; the
checkpoint format is the agent's, and a damaged file is refused."""

import os

import numpy as np
import pytest

from arachne_torch import checkpoint as ck
from arachne_torch import state as st
from arachne_torch.corpus import SyntheticCorpus
from arachne_torch.job import Model


def test_corpus_matches_the_reference_engines_samples():
    # SyntheticCorpus(1, 256, 16).Sample(0 and 1), printed by the C++ class.
    got = SyntheticCorpus(1, 256, 16).samples(0, 2)
    assert got.tolist() == [
        [193, 169, 69, 26, 108, 191, 210, 130, 171, 122, 31, 178, 154, 44, 125,
         8, 62],
        [10, 106, 240, 248, 247, 42, 184, 243, 52, 117, 56, 245, 194, 0, 222,
         19, 158]]


def test_samples_do_not_depend_on_how_they_are_read():
    c = SyntheticCorpus(7, 512, 32)
    assert (c.samples(5, 3) == c.samples(0, 8)[5:]).all()


@pytest.mark.parametrize("n,value", [
    (0, 0x4DED76A663920233), (7, 0x1F15354702F1031B),
    (32, 0x0A3204130F965ED0), (64, 0xD4915A4DCE3FE961),
    (65, 0x40FCFEFEDD2E3C3B), (100, 0xE0F56E8269898C2B)])
def test_checksum_has_the_migration_librarys_values(n, value):
    # migration::Checksum of bytes 0, 1, ..., n-1, printed by the C++
    # function: the lanes, the tail words and the tail bytes.
    assert ck.checksum(bytes(range(n))) == value


@pytest.fixture
def state(tiny_gpt):
    return st.model_state(Model.from_proto(tiny_gpt))


def whole(state, seed):
    rng = np.random.default_rng(seed)
    return {(i, 0, t.bytes): rng.integers(0, 256, t.bytes,
                                          dtype=np.uint8).tobytes()
            for i, t in enumerate(state)}


def test_a_checkpoint_reads_back_whole_from_two_half_shards(tmp_path, state):
    pieces = whole(state, 1)
    first = {(i, 0, t.bytes // 2): pieces[(i, 0, t.bytes)][:t.bytes // 2]
             for i, t in enumerate(state)}
    second = {(i, t.bytes // 2, t.bytes): pieces[(i, 0, t.bytes)][t.bytes // 2:]
              for i, t in enumerate(state)}
    ck.write_shard(str(tmp_path), state, "n0", 0, first)
    ck.write_shard(str(tmp_path), state, "n/1", 3, second)
    assert sorted(os.listdir(tmp_path)) == ["shard-n.1-3.bin",
                                            "shard-n0-0.bin"]
    full = ck.read_checkpoint(str(tmp_path), state, "tiny-gpt")
    assert [bytes(f) for f in full] == [pieces[(i, 0, t.bytes)]
                                        for i, t in enumerate(state)]


def test_damage_is_named(tmp_path, state):
    ck.write_shard(str(tmp_path), state, "n0", 0, whole(state, 2))
    path = tmp_path / "shard-n0-0.bin"
    data = bytearray(path.read_bytes())
    # Flip a byte of the first tensor's data (after magic, count, the name
    # length and name, begin, end, checksum).
    at = 8 + 4 + 4 + len(state[0].name) + 24 + 10
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointError) as e:
        ck.read_checkpoint(str(tmp_path), state, "tiny-gpt")
    assert e.value.code == "DATA_LOSS"
    assert str(e.value) == (f"{path}: tensor 'embedding.weight:weight' bytes "
                            f"[0, {state[0].bytes}): checksum mismatch")
    path.write_bytes(bytes(data[:100]))
    with pytest.raises(ck.CheckpointError) as e:
        ck.read_checkpoint(str(tmp_path), state, "tiny-gpt")
    assert str(e.value) == (f"{path}: tensor 'embedding.weight:weight' range "
                            f"[0, {state[0].bytes}) is out of bounds or "
                            "truncated")


def test_a_missing_byte_and_an_empty_directory_are_named(tmp_path, state):
    with pytest.raises(ck.CheckpointError) as e:
        ck.read_checkpoint(str(tmp_path), state, "tiny-gpt")
    assert (e.value.code, str(e.value)) == (
        "NOT_FOUND", f"checkpoint_dir {tmp_path}: no shard files")
    pieces = whole(state, 3)
    del pieces[(5, 0, state[5].bytes)]
    ck.write_shard(str(tmp_path), state, "n0", 0, pieces)
    with pytest.raises(ck.CheckpointError) as e:
        ck.read_checkpoint(str(tmp_path), state, "tiny-gpt")
    assert (e.value.code, str(e.value)) == (
        "FAILED_PRECONDITION",
        f"no shard holds byte 0 of tensor '{state[5].name}'")
