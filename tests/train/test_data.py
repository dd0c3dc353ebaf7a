import hashlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from scaling.train import data
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
    parts = {part for rel, _ in data._stdlib_files() for part in Path(rel).parts[:-1]}
    assert not parts & {"test", "tests", "idle_test", "site-packages", "__pycache__"}
    assert {"json", "email", "asyncio"} <= parts


def test_pysrc_is_the_stdlib_and_installed_packages_without_tests_or_the_project():
    files, stdlib = dict(data._pysrc_files()), dict(data._stdlib_files())
    # the stdlib under the same relative paths (so its files fall on the same side of the split), and more
    assert all(files[rel].resolve() == path.resolve() for rel, path in stdlib.items()) and len(files) > 2 * len(stdlib)
    assert files["numpy/__init__.py"].resolve() == Path(np.__file__).resolve()
    assert not {part for rel in files for part in Path(rel).parts[:-1]} & {"test", "tests", "idle_test", "__pycache__"}
    project = Path(__file__).resolve().parents[2]  # on sys.path when run with PYTHONPATH=the checkout
    venv = Path(sys.prefix).resolve()  # CI's virtual environment lives inside the checkout
    assert not any(path.resolve().is_relative_to(project) and not path.resolve().is_relative_to(venv)
                   for path in files.values())

    corpus = data.load("pysrc")
    assert corpus.bytes == sum(path.stat().st_size for path in files.values()) > 3 * data.load("stdlib").bytes
    assert isinstance(corpus.train, np.memmap) and corpus.train.size + corpus.val.size == corpus.bytes
    # numpy's __init__.py is where the file offsets say, on the side its path hashes to
    side = int(data.is_validation_file("numpy/__init__.py"))
    index = [rel for rel in files if data.is_validation_file(rel) == side].index("numpy/__init__.py")
    start = corpus.doc_starts[side][index]
    content = Path(np.__file__).read_bytes()
    assert (corpus.train, corpus.val)[side][start:start + len(content)].tobytes() == content
    again = data.load("pysrc")
    assert again.fingerprint == corpus.fingerprint and isinstance(again.val, np.memmap)


def test_split_by_file_is_stable_when_files_are_added(tmp_path):
    root = tmp_path / "texts"
    root.mkdir()

    def add(numbers):
        for i in numbers:
            (root / f"f{i:04d}.txt").write_text(f"line of file {i}\n")

    def validation_lines():
        return set(data.load(str(root)).val.tobytes().decode().splitlines())

    add(range(300))
    before = validation_lines()
    assert before == {f"line of file {i}" for i in range(300) if data.is_validation_file(f"f{i:04d}.txt")} != set()
    add(range(300, 900))
    after = validation_lines()
    assert {line for line in after if int(line.split()[-1]) < 300} == before and len(after) > len(before)


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


def test_token_files_are_memory_mapped_and_scanned_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_CHUNK", 1000)  # the fingerprint and range come from 20+ chunks
    tokens = np.random.default_rng(0).integers(0, 70_000, 20_011)
    files = {"t.u32.bin": tokens.astype("<u4"), "t.bin": (tokens % 50_000).astype("<u2"), "t.npy": tokens.astype(np.int32)}
    for name, array in files.items():
        (array.tofile if name.endswith(".bin") else lambda path, a=array: np.save(path, a))(tmp_path / name)
    for name, expected in files.items():
        corpus = data.load(str(tmp_path / name))
        assert isinstance(corpus.train, np.memmap) and isinstance(corpus.val, np.memmap)
        assert not corpus.train.flags.owndata and corpus.train.dtype == expected.dtype
        n_val = expected.size * data.VALIDATION_PER_MILLE // 1000
        train, val = expected[:-n_val], expected[-n_val:]
        assert np.array_equal(corpus.train, train) and np.array_equal(corpus.val, val)
        # the streamed hash is the hash of the whole array; vocab from the largest token
        assert corpus.fingerprint == hashlib.sha256(str(expected.dtype).encode() + expected.tobytes()).hexdigest()
        assert corpus.vocab == -(-(int(expected.max()) + 1) // 64) * 64 and corpus.tokenizer == "array"
        assert corpus.token_bytes is None  # no text behind these tokens: no bits per byte
        for step in range(3):
            assert np.array_equal(data.batch(corpus.train, 1, step, 4, 16), data.batch(train, 1, step, 4, 16))
        assert np.array_equal(data.eval_windows(corpus.val, 256, 16), data.eval_windows(val, 256, 16))
    # the scan is cached by (path, size, mtime): a second load does not read the file through
    monkeypatch.setattr(data, "_scan", lambda tokens: pytest.fail("scanned again"))
    assert data.load(str(tmp_path / "t.bin")).fingerprint == hashlib.sha256(
        b"uint16" + files["t.bin"].tobytes()).hexdigest()
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(ConfigError, match="data.source.*uint16 .bin"):
        data.load(str(tmp_path / "odd.bin"))


def _word_files(root: Path, n_files: int = 150) -> Path:
    """~90 kB of ASCII text over a small vocabulary (so BPE merges whole words quickly)."""
    words = "the of and to in is was for on that with as by at from def return self import class".split()
    rng = np.random.default_rng(0)
    root.mkdir()
    for i in range(n_files):
        lines = [" ".join(rng.choice(words, 10)) for _ in range(12)]
        (root / f"doc{i:03d}.txt").write_text("\n".join(lines) + "\n")
    return root


def test_bpe_is_trained_on_the_training_split_round_trips_and_is_cached(tmp_path):
    from tokenizers import Tokenizer

    root = _word_files(tmp_path / "words")
    # one word only in a validation file, another only in a training file, both frequent
    held_out = next(f"held{i}.txt" for i in range(10_000) if data.is_validation_file(f"held{i}.txt"))
    (root / held_out).write_text(" zyxwvutsrq" * 3000)
    assert not data.is_validation_file("trainonly.txt")
    (root / "trainonly.txt").write_text(" qrstuvwxyz" * 3000)
    text, bpe = data.load(str(root)), data.load(str(root), "bpe:300")
    assert (bpe.vocab, bpe.tokenizer, bpe.train.dtype) == (300, "bpe:300", np.uint16)
    assert isinstance(bpe.train, np.memmap) and max(bpe.train.max(), bpe.val.max()) < 300
    assert (bpe.fingerprint, bpe.bytes) == (text.fingerprint, text.bytes)  # the same text, other tokens
    assert bpe.train.size < text.train.size / 2
    tokenizer = Tokenizer.from_str(bpe.tokenizer_json)
    learned = tokenizer.get_vocab()
    assert any("qrstuvwxyz" in token for token in learned) and not any("zyxw" in token for token in learned)
    val_text = text.val.tobytes().decode()
    assert "zyxwvutsrq" in val_text and tokenizer.decode(bpe.val.tolist()) == val_text
    assert tokenizer.decode(tokenizer.encode(val_text).ids) == val_text
    unusual = "naïve café — ü ∑ 🙂\n\tx  y"  # characters the training text never had: byte fallback
    assert tokenizer.decode(tokenizer.encode(unusual).ids) == unusual
    assert bpe.token_bytes[bpe.val].sum() == len(val_text.encode())
    described = bpe.describe()
    assert described["tokenizer"] == "bpe:300" and described["vocab"] == 300
    assert described["tokenizer_sha256"] == hashlib.sha256(bpe.tokenizer_json.encode()).hexdigest()
    # a second load is the cache: identical tokens, tokenizer and fingerprint
    again = data.load(str(root), "bpe:300")
    assert np.array_equal(again.train, bpe.train) and np.array_equal(again.val, bpe.val)
    assert (again.tokenizer_sha256, again.fingerprint) == (bpe.tokenizer_sha256, bpe.fingerprint)
    assert len(list(data.cache_dir().glob("bpe-*/tokenizer.json"))) == 1


@pytest.mark.parametrize("tokenizer, source", [
    ("bpe:256", "stdlib"), ("bpe:65537", "stdlib"), ("bpe:x", "stdlib"), ("wordpiece", "stdlib"), (4096, "stdlib"),
    ("bpe:4096", "synthetic"), ("bpe:4096", "tokens.npy"),
])
def test_bad_tokenizers_are_one_line_config_errors(tmp_path, tokenizer, source):
    np.save(tmp_path / "tokens.npy", np.arange(100))
    source = source if source in ("stdlib", "synthetic") else str(tmp_path / source)
    with pytest.raises(ConfigError) as err:
        data.load(source, tokenizer)
    assert err.value.key == "data.tokenizer" and "\n" not in str(err.value)
    assert ("257 to 65536" if source == "stdlib" else '"bytes" for data.source') in str(err.value)


def test_bits_per_byte_counts_the_bytes_the_targets_decode_to(tmp_path):
    from tokenizers import Tokenizer

    byte_windows = data.eval_windows(np.frombuffer(b"hello world " * 100, np.uint8), 256, 32)
    n_bytes = data.target_bytes(byte_windows, data.load("synthetic").token_bytes)
    assert n_bytes == byte_windows[:, 1:].size  # one byte per byte token
    assert data.bits_per_byte(2.0, byte_windows, n_bytes) == pytest.approx(2.0 / math.log(2))
    assert data.target_bytes(byte_windows, None) is None and data.bits_per_byte(2.0, byte_windows, None) is None
    bpe = data.load(str(_word_files(tmp_path / "words")), "bpe:300")
    tokenizer = Tokenizer.from_str(bpe.tokenizer_json)
    windows = data.train_sample(bpe.train, 2048, 16)
    direct = sum(len(tokenizer.decode(w[1:].tolist()).encode()) for w in windows)  # ASCII: no cut characters
    assert data.target_bytes(windows, bpe.token_bytes) == direct > 2 * windows[:, 1:].size
    loss = 1.5
    assert data.bits_per_byte(loss, windows, direct) == pytest.approx(loss * windows[:, 1:].size / direct / math.log(2))


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


def test_the_synthetic_chain_is_cached_across_processes_and_a_damaged_cache_is_recomputed():
    """The chain's bytes are kept under the cache (every process of a sweep loads them): a cached load,
    and one whose cached bytes were damaged, give the chain computed step by step."""
    rng = np.random.default_rng(7)
    successors = np.stack([rng.choice(256, data.SYNTHETIC_SUCCESSORS, replace=False) for _ in range(256)])
    cdf = np.cumsum(rng.dirichlet(np.ones(data.SYNTHETIC_SUCCESSORS), size=256), axis=1)
    draws = rng.random(5000)
    direct = data._markov_chain(successors, cdf, draws)
    assert np.array_equal(data._cached_chain(successors, cdf, draws), direct)  # built and kept
    (cached,) = data.cache_dir().glob("synthetic-*/tokens.npy")
    assert np.array_equal(np.load(cached), direct)
    assert np.array_equal(data._cached_chain(successors, cdf, draws), direct)  # read back
    np.save(cached, (direct + 1).astype(np.uint8))  # damaged: not what was written
    assert np.array_equal(data._cached_chain(successors, cdf, draws), direct)
    # other draws are another chain, cached apart
    assert np.array_equal(data._cached_chain(successors, cdf, draws[::-1]), data._markov_chain(successors, cdf, draws[::-1]))
    assert len(list(data.cache_dir().glob("synthetic-*/tokens.npy"))) == 2


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


def test_a_pinned_fingerprint_names_the_corpus_the_source_resolves_to():
    corpus = data.synthetic_corpus()
    data.check_fingerprint(corpus, "")  # pins nothing
    data.check_fingerprint(corpus, corpus.fingerprint[:12])
    data.check_fingerprint(corpus, corpus.fingerprint)
    with pytest.raises(ConfigError, match=f"data.fingerprint: got '0{{12}}'.*resolves to here, {corpus.fingerprint[:12]}"):
        data.check_fingerprint(corpus, "0" * 12)
