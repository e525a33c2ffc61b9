"""Token files as data (engine.token_file): every bad file is refused
before training starts, naming the field and the value; sample i is read
from the file by its index alone, whatever the plan."""

import os
import struct

import grpc
import numpy as np
import pytest

from arachne.v1 import agent_pb2
from arachne_torch import corpus as corpus_module
from arachne_torch import state as st
from arachne_torch.corpus import TokenFileCorpus, make_corpus
from arachne_torch.job import (BadRequest, EngineConfig, Job,
                               TokenFile)

# The one-GPU job of the engine-process tests (tiny-gpt, vocab 512, seq_len
# 32, global batch 16 in 4 micro-batches of 4), its engine and its store.
from test_engine_process import (code_and_message, engine,  # noqa: F401
                                 one_rank_trainer, prepare, store)


def write(tmp_path, tokens, token_bytes, name="tokens.bin"):
    path = tmp_path / name
    fmt = "<H" if token_bytes == 2 else "<I"
    path.write_bytes(b"".join(struct.pack(fmt, t) for t in tokens))
    return str(path)


def refusal(path, token_bytes=2, vocab=512, seq_len=4):
    with pytest.raises(BadRequest) as e:
        TokenFileCorpus(path, token_bytes, vocab, seq_len)
    return str(e.value)


# -- reading the request ----------------------------------------------------

def test_token_file_is_read_only_when_set(tiny_gpt):
    r = agent_pb2.PrepareRequest()
    r.model_spec.CopyFrom(tiny_gpt)
    assert Job.from_request(r).engine.token_file is None
    r.engine.token_file.path = "/data/train.bin"
    r.engine.token_file.token_bytes = 4
    assert Job.from_request(r).engine == EngineConfig(
        token_file=TokenFile("/data/train.bin", 4))


@pytest.mark.parametrize("path,token_bytes,message", [
    ("", 2, "engine.token_file.path: required (an absolute path), got none"),
    ("data/train.bin", 2,
     "engine.token_file.path: must be an absolute path, got "
     "\"data/train.bin\""),
    ("/" + "a" * 4096, 2,
     "engine.token_file.path: at most 4096 bytes, got 4097 bytes "
     "(\"/" + "a" * 63 + "...\")"),
    ("/data/train.bin", 0,
     "engine.token_file.token_bytes: must be 2 (uint16) or 4 (uint32), got 0"),
    ("/data/train.bin", 8,
     "engine.token_file.token_bytes: must be 2 (uint16) or 4 (uint32), got 8"),
])
def test_bad_token_file_fields_are_refused_with_the_job(tiny_gpt, path,
                                                        token_bytes, message):
    r = agent_pb2.PrepareRequest()
    r.model_spec.CopyFrom(tiny_gpt)
    r.engine.token_file.path = path
    r.engine.token_file.token_bytes = token_bytes
    with pytest.raises(BadRequest) as e:
        Job.from_request(r)
    assert str(e.value) == message
    # The corpus checks them too when made directly.
    assert refusal(path, token_bytes) == message


# -- checking the file --------------------------------------------------------

def test_a_path_that_is_missing_or_not_a_regular_file_is_named(tmp_path):
    missing = str(tmp_path / "nope.bin")
    assert refusal(missing) == \
        f"engine.token_file.path: \"{missing}\" does not exist"
    under_a_file = write(tmp_path, [1, 2], 2) + "/x.bin"
    assert refusal(under_a_file) == \
        f"engine.token_file.path: \"{under_a_file}\" does not exist"
    assert refusal(str(tmp_path)) == (
        f"engine.token_file.path: \"{tmp_path}\" is a directory, not a "
        "regular file")
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    assert refusal(fifo) == (
        f"engine.token_file.path: \"{fifo}\" is a FIFO, not a regular file")


def test_an_unreadable_file_is_named(tmp_path, monkeypatch):
    path = write(tmp_path, range(10), 2)
    os.chmod(path, 0)
    if os.geteuid() == 0:  # root reads it anyway: refuse the open
        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied", path)
        monkeypatch.setattr(corpus_module, "open", refuse, raising=False)
    assert refusal(path) == (f"engine.token_file.path: \"{path}\" cannot be "
                             "read: Permission denied")


def test_a_size_that_is_not_a_whole_number_of_tokens_is_named(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(bytes(21))
    assert refusal(str(path), 2) == (
        f"engine.token_file: \"{path}\" has 21 bytes, not a whole number of "
        "tokens of token_bytes 2")
    path = tmp_path / "six.bin"
    path.write_bytes(bytes(22))
    assert refusal(str(path), 4) == (
        f"engine.token_file: \"{path}\" has 22 bytes, not a whole number of "
        "tokens of token_bytes 4")


def test_a_file_shorter_than_one_sample_is_named(tmp_path):
    path = write(tmp_path, range(4), 2)
    assert refusal(path, seq_len=4) == (
        f"engine.token_file.path: \"{path}\" holds 4 tokens, fewer than the "
        "seq_len + 1 = 5 of one sample")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert refusal(str(empty), 4).startswith(
        f"engine.token_file.path: \"{empty}\" holds 0 tokens")
    TokenFileCorpus(write(tmp_path, range(5), 2, "five.bin"), 2, 512, 4)


def test_the_first_token_id_outside_the_vocabulary_is_named(tmp_path,
                                                             monkeypatch):
    # Chunks of 4 tokens: the offender is in the third chunk, a later one
    # would be too.
    monkeypatch.setattr(corpus_module, "SCAN_CHUNK_TOKENS", 4)
    tokens = [5] * 20
    tokens[9], tokens[15] = 512, 70000
    path = write(tmp_path, tokens, 4)
    assert refusal(path, 4, vocab=512) == (
        f"engine.token_file.path: \"{path}\": token 9 is 512, not below the "
        "model's vocab 512 (model_spec.vocab; token_bytes 4)")
    # uint16 ids up to 65535 are read unsigned.
    path = write(tmp_path, [0, 1, 65535, 2, 3], 2, "u16.bin")
    assert refusal(path, 2, vocab=65535) == (
        f"engine.token_file.path: \"{path}\": token 2 is 65535, not below the "
        "model's vocab 65535 (model_spec.vocab; token_bytes 2)")
    TokenFileCorpus(path, 2, 65536, 4)


# -- reading samples ----------------------------------------------------------

def test_uint16_samples_wrap_over_the_files_whole_samples(tmp_path):
    # 8 tokens, seq_len 3: S = (8 - 1) // 3 = 2 whole samples, at tokens 0
    # and 3; token 7 is never read, sample 2 is sample 0 again.
    path = write(tmp_path, [10, 11, 12, 13, 14, 15, 16, 17], 2)
    c = TokenFileCorpus(path, 2, 512, 3)
    assert (c.num_tokens, c.num_samples) == (8, 2)
    got = c.samples(0, 5)
    assert got.dtype == np.int64 and got.shape == (5, 4)
    assert got.tolist() == [[10, 11, 12, 13], [13, 14, 15, 16],
                            [10, 11, 12, 13], [13, 14, 15, 16],
                            [10, 11, 12, 13]]
    # The cursor keeps growing over many epochs.
    assert c.samples(10**12 + 1, 1).tolist() == [[13, 14, 15, 16]]


def test_uint32_samples_are_little_endian_and_wrap(tmp_path):
    # 7 tokens, seq_len 2: S = 3, at tokens 0, 2 and 4; ids above 65535.
    base = 70000
    path = write(tmp_path, [base + k for k in range(7)], 4)
    c = TokenFileCorpus(path, 4, 100000, 2)
    assert c.num_samples == 3
    assert (c.samples(2, 3) - base).tolist() == [[4, 5, 6], [0, 1, 2],
                                                 [2, 3, 4]]


def test_samples_depend_on_the_index_only_whatever_the_split(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "r.bin"
    path.write_bytes(rng.integers(0, 512, 1000, dtype="<u2").tobytes())
    c = TokenFileCorpus(str(path), 2, 512, 32)   # S = 31
    whole = c.samples(0, 100)
    for split in ([100], [4] * 25, [1, 30, 2, 67], [31, 31, 31, 7]):
        first, parts = 0, []
        for n in split:
            parts.append(c.samples(first, n))
            first += n
        assert (np.concatenate(parts) == whole).all()
    assert (whole[31:62] == whole[:31]).all()


def test_make_corpus_picks_the_jobs_data(tiny_gpt, tmp_path):
    r = agent_pb2.PrepareRequest()
    r.model_spec.CopyFrom(tiny_gpt)
    r.training.seq_len = 4
    assert type(make_corpus(Job.from_request(r))).__name__ == "SyntheticCorpus"
    r.engine.token_file.path = write(tmp_path, range(9), 2)
    r.engine.token_file.token_bytes = 2
    c = make_corpus(Job.from_request(r))
    assert isinstance(c, TokenFileCorpus) and c.num_samples == 2


# -- training on one ------------------------------------------------------------

def test_a_bad_token_file_is_refused_before_the_trainer_is_built(tmp_path,
                                                                 store):
    r = prepare(7, store)
    r.engine.token_file.path = write(tmp_path, [1, 2, 600] + [3] * 40, 2)
    r.engine.token_file.token_bytes = 2
    with pytest.raises(BadRequest) as e:
        one_rank_trainer(r)
    assert str(e.value) == (
        f"engine.token_file.path: \"{r.engine.token_file.path}\": token 2 is "
        "600, not below the model's vocab 512 (model_spec.vocab; token_bytes "
        "2)")


def test_a_one_rank_trainer_learns_a_token_file(tmp_path, store):
    # A learnable stream: each token determines the next (a stride-7 walk
    # over the 512 ids), 4000 tokens = 124 samples of seq_len 32, so the 16
    # samples of each iteration are new ones.
    r = prepare(8, store)  # generations the engine test does not use
    r.engine.token_file.path = str(tmp_path / "walk.bin")
    (tmp_path / "walk.bin").write_bytes(
        ((np.arange(4000) * 7) % 512).astype("<u2").tobytes())
    r.engine.token_file.token_bytes = 2
    r.engine.learning_rate = 3e-3
    trainer = one_rank_trainer(r)
    want = trainer.corpus.samples(16, 4)
    assert (((want[:, 1:] - want[:, :-1]) % 512) == 7).all()
    assert (trainer._tokens(16, False).numpy() == want[:, :-1]).all()
    losses = [trainer.run_iteration().loss for _ in range(4)]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 0.5, losses
    assert trainer.scalars[st.SCALAR_CURSOR] == 4 * 16


def test_the_engine_refuses_a_bad_token_file_with_invalid_argument(
        engine, store, tmp_path):
    stub, _ = engine
    r = prepare(1, store)
    r.engine.token_file.path = str(tmp_path / "odd.bin")
    (tmp_path / "odd.bin").write_bytes(bytes(99))
    r.engine.token_file.token_bytes = 2
    code, message = code_and_message(stub.Prepare, r)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # (engine.py words a ValueError of Trainer(...) "layout: ...", so the
    # message is looked for, not matched whole.)
    assert (f"engine.token_file: \"{tmp_path}/odd.bin\" has 99 bytes, not a "
            "whole number of tokens of token_bytes 2") in message
    # Nothing was prepared: the same generation prepares with a good file.
    (tmp_path / "odd.bin").write_bytes(bytes(100))
    stub.Prepare(r, timeout=60)
    assert stub.Status(agent_pb2.StatusRequest()).phase == \
        agent_pb2.PHASE_PREPARED
