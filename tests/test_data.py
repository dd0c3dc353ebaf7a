import hashlib
import math
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from scaling import data
from scaling.errors import ConfigError


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALING_CACHE", str(tmp_path / "cache"))


def test_stdlib_corpus_is_the_interpreters_own_source_split_by_file():
    corpus = data.load("stdlib")
    assert 12e6 <= corpus.bytes <= 30e6
    assert corpus.vocab == 256 and corpus.train.dtype == np.uint8
    # every byte lands in exactly one split, and the split is ~2% by file
    assert corpus.train.size + corpus.val.size == corpus.bytes
    assert 0.01 < corpus.val.size / corpus.bytes < 0.04
    assert b"def " in corpus.train[:100_000].tobytes() and b"import " in corpus.val.tobytes()
    # a second load is served from the .npy cache and is identical
    again = data.load("stdlib")
    assert again.fingerprint == corpus.fingerprint and np.array_equal(again.val, corpus.val)
    assert len(list(data.cache_dir().glob("corpus-*/train.npy"))) == 1


def test_stdlib_files_leave_out_tests_and_installed_packages():
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = {part for f in data._stdlib_files(root) for part in f.relative_to(root).parts[:-1]}
    assert not parts & {"test", "tests", "idle_test", "site-packages", "__pycache__"}
    assert {"json", "email", "asyncio"} <= parts


def test_validation_membership_is_a_fixed_hash_of_the_path():
    for rel in ("os.py", "json/decoder.py", "email/mime/text.py"):
        digest = hashlib.sha256(rel.encode()).digest()
        expected = int.from_bytes(digest[:8], "little") % 1000 < 20
        assert data.is_validation_file(rel) is expected
    flags = [data.is_validation_file(f"pkg/module_{i}.py") for i in range(20_000)]
    assert 0.015 < np.mean(flags) < 0.025


def test_text_directory_fingerprint_tracks_content(tmp_path):
    root = tmp_path / "texts"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("hello world\n" * 50)
    (root / "sub" / "b.txt").write_text("the quick brown fox\n" * 50)
    (root / ".hidden").write_text("never read")
    first = data.load(str(root))
    assert first.bytes == 12 * 50 + 20 * 50  # the hidden file is skipped
    assert sorted(set(np.concatenate([first.train, first.val]).tobytes())) == sorted(set(b"hello world\nthe quick brown fox\n"))
    assert data.load(str(root)).fingerprint == first.fingerprint
    (root / "a.txt").write_text("hello there\n" * 51)
    changed = data.load(str(root))
    assert changed.fingerprint != first.fingerprint and changed.bytes == 12 * 51 + 20 * 50


def test_token_arrays_npy_and_uint16_bin(tmp_path):
    tokens = (np.arange(5000) * 7919 % 300).astype(np.int64)
    np.save(tmp_path / "t.npy", tokens)
    tokens.astype("<u2").tofile(tmp_path / "t.bin")
    npy, binary = data.load(str(tmp_path / "t.npy")), data.load(str(tmp_path / "t.bin"))
    assert npy.vocab == binary.vocab == 320  # max 299 + 1, rounded up to a multiple of 64
    assert npy.val.size == binary.val.size == 100  # the last 2%
    assert np.array_equal(npy.val, tokens[-100:]) and np.array_equal(binary.train, tokens[:-100])
    assert npy.fingerprint != binary.fingerprint  # dtype is part of the identity


def test_bad_sources_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="data.source"):
        data.load(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="data.source"):
        data.load(str(tmp_path / "empty"))
    np.save(tmp_path / "floats.npy", np.ones(10, np.float32))
    with pytest.raises(ConfigError, match="integer token array"):
        data.load(str(tmp_path / "floats.npy"))


def test_synthetic_chain_has_eight_successors_and_its_entropy_rate():
    corpus = data.load("synthetic")
    tokens = np.concatenate([corpus.train, corpus.val]).astype(np.int64)
    counts = np.zeros((256, 256))
    np.add.at(counts, (tokens[:-1], tokens[1:]), 1)
    assert (counts > 0).sum(axis=1).max() == data.SYNTHETIC_SUCCESSORS
    # the empirical conditional entropy of the sample matches the stated entropy rate
    p = counts / counts.sum(axis=1, keepdims=True).clip(1)
    cond = -(counts.sum(1) / counts.sum() * np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(1)).sum()
    assert corpus.entropy_rate == pytest.approx(cond, abs=0.01)
    assert corpus.entropy_rate < math.log(8)
    assert corpus.val.size == data.SYNTHETIC_VAL_TOKENS


def test_batches_are_a_pure_function_of_seed_and_step():
    tokens = np.arange(100_000, dtype=np.int64)  # each window must be a run of consecutive ids
    in_order = [data.batch(tokens, 3, step, 8, 16) for step in range(10)]
    assert np.array_equal(data.batch(tokens, 3, 7, 8, 16), in_order[7])  # a "restarted" run
    assert in_order[0].shape == (8, 17) and in_order[0].dtype == np.int32
    assert np.all(np.diff(in_order[4], axis=1) == 1)
    assert not np.array_equal(in_order[1], in_order[2])
    assert not np.array_equal(data.batch(tokens, 4, 1, 8, 16), in_order[1])
    # offsets cover the corpus: the largest start over many steps is near the end
    starts = np.concatenate([data.batch(tokens, 0, s, 8, 16)[:, 0] for s in range(200)])
    assert starts.min() < 2_000 and starts.max() > 98_000 - 16


def test_eval_windows_span_the_split_without_overlap():
    tokens = np.arange(1000, dtype=np.int64)
    windows = data.eval_windows(tokens, eval_tokens=100, seq_len=16)
    assert windows.shape == (6, 17)  # 100 // 16 windows, 96 predicted tokens
    assert np.array_equal(windows[:, 0], np.arange(6) * (999 // 6))  # evenly spread over the split
    assert windows[-1, -1] > 800 and np.all(np.diff(windows, axis=1) == 1)
    assert np.all(windows[1:, 1] > windows[:-1, -1])  # no target predicted twice
    # the whole split: contiguous windows sharing one token
    whole = data.eval_windows(tokens[:97], eval_tokens=96, seq_len=16)
    assert np.array_equal(whole[:-1, -1], whole[1:, 0]) and whole[-1, -1] == 96
    with pytest.raises(ConfigError, match="data.eval_tokens"):
        data.eval_windows(tokens, eval_tokens=2000, seq_len=16)
    sample = data.train_sample(tokens, 64, 16)
    assert np.array_equal(sample, data.train_sample(tokens, 64, 16)) and sample.shape == (4, 17)
