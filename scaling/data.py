"""Corpora as token arrays, and deterministic batches from (seed, step).

Sources (`data.source` in a run config):

- ``"stdlib"`` (default, no download): byte-level tokens (vocab 256) of the running
  interpreter's own standard-library ``*.py`` files, without ``site-packages`` and test
  directories (about 12 MB of text written by people).
- a path to a text file or a directory of text files (every regular file, recursively;
  hidden files and directories skipped): byte-level tokens, vocab 256.
- a path to a pre-tokenised array: ``.npy`` (any integer dtype) or raw little-endian
  ``uint16`` ``.bin``; vocab = largest token + 1, rounded up to a multiple of 64.
- ``"synthetic"``: a seeded random first-order Markov chain over bytes whose entropy rate
  (the best achievable loss) is known; small and learnable, for tests.

Train/validation split: for file sources a FIXED split by file (a file is validation when
``sha256(relative path) mod 1000 < 20``, about 2%), so adding or removing other files never
moves a file between splits (a single file, or a few files all on one side, fall back to the
tail split); token arrays hold out their last 2%, the synthetic chain its last 65537 tokens.

Fingerprint: sha256 over sha256(relative path) || sha256(content) of every file in path order
(for arrays: over dtype and bytes), recorded with the byte count in every run, so results are
tied to the exact text (another Python version's stdlib is another corpus).
File corpora are cached as .npy under ``$SCALING_CACHE`` (default ``~/.cache/scaling``),
keyed by a stat listing (path, size, mtime) of the source, written atomically.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scaling.errors import ConfigError

BYTE_VOCAB = 256
VALIDATION_PER_MILLE = 20  # ~2% of files (or of an array's tail) held out
SYNTHETIC_TOKENS = 1 << 20
SYNTHETIC_VAL_TOKENS = (1 << 16) + 1  # the default eval_tokens (65536) fits
SYNTHETIC_SUCCESSORS = 8  # each byte is followed by one of 8 bytes: learnable by a tiny model
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
_TRAIN_SAMPLE_KEY = 2**64 - 1  # Philox key word for the fixed train-loss sample (no run seed uses it)


@dataclass(frozen=True)
class Corpus:
    """Tokens of one source, split once. `fingerprint` is the content hash, `bytes` the source size."""

    source: str
    train: np.ndarray  # 1-D, uint8 (bytes) or uint16/int32 (token arrays)
    val: np.ndarray
    vocab: int
    fingerprint: str
    bytes: int
    entropy_rate: float | None = None  # nats/token; known only for the synthetic chain

    def __post_init__(self) -> None:
        # Corpora are shared (cached per process): nobody may write into them.
        self.train.setflags(write=False)
        self.val.setflags(write=False)

    def describe(self) -> dict:
        """What a run records about its data."""
        return {"source": self.source, "fingerprint": self.fingerprint, "bytes": self.bytes,
                "vocab": self.vocab, "train_tokens": int(self.train.size),
                "val_tokens": int(self.val.size)}


def load(source: str) -> Corpus:
    """The corpus named by `data.source` (see the module docstring); bad sources raise ConfigError."""
    if source == "synthetic":
        return synthetic_corpus()
    if source == "stdlib":
        return _file_corpus("stdlib", Path(sysconfig.get_paths()["stdlib"]), _stdlib_files)
    path = Path(source).expanduser()
    if not path.exists():
        raise ConfigError("data.source", source, '"stdlib", "synthetic", or an existing file or directory')
    if path.suffix in (".npy", ".bin") and path.is_file():
        return _array_corpus(source, path)
    return _file_corpus(source, path, _text_files)


# ---------------------------------------------------------------- file corpora (stdlib, text)


def _stdlib_files(root: Path) -> list[Path]:
    return [p for p in _walk(root) if p.suffix == ".py"]


def _text_files(root: Path) -> list[Path]:
    return [root] if root.is_file() else _walk(root)


def _walk(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS and not d.startswith("."))
        files += [Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")]
    return [f for f in files if f.is_file()]


def is_validation_file(relpath: str) -> bool:
    """The fixed by-file split: a stable hash of the relative path, never a random draw."""
    digest = hashlib.sha256(relpath.encode()).digest()
    return int.from_bytes(digest[:8], "little") % 1000 < VALIDATION_PER_MILLE


def _file_corpus(source: str, root: Path, list_files) -> Corpus:
    files = list_files(root)
    if not files:
        raise ConfigError("data.source", source, "a file or a directory holding at least one file")
    base = root.parent if root.is_file() else root
    stats = [(str(f.relative_to(base)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    stat_key = hashlib.sha256(json.dumps([str(root.resolve()), sorted(stats)]).encode()).hexdigest()[:16]
    cache = cache_dir() / f"corpus-{stat_key}"
    if (cache / "meta.json").is_file():
        meta = json.loads((cache / "meta.json").read_text())
        return Corpus(source, np.load(cache / "train.npy"), np.load(cache / "val.npy"), BYTE_VOCAB,
                      meta["fingerprint"], meta["bytes"])

    digest, train_parts, val_parts, total = hashlib.sha256(), [], [], 0
    for rel, f in sorted(zip((s[0] for s in stats), files)):
        content = f.read_bytes()
        digest.update(hashlib.sha256(rel.encode()).digest() + hashlib.sha256(content).digest())
        (val_parts if is_validation_file(rel) else train_parts).append(content)
        total += len(content)
    train = np.frombuffer(b"".join(train_parts), dtype=np.uint8)
    val = np.frombuffer(b"".join(val_parts), dtype=np.uint8)
    if not train.size or not val.size:  # a single file or a tiny directory: fall back to a tail split
        train, val = _tail_split(np.frombuffer(b"".join(train_parts + val_parts), dtype=np.uint8))
    corpus = Corpus(source, train, val, BYTE_VOCAB, digest.hexdigest(), total)
    _write_cache(cache, corpus)
    return corpus


def cache_dir() -> Path:
    return Path(os.environ.get("SCALING_CACHE", Path.home() / ".cache" / "scaling"))


def _write_cache(cache: Path, corpus: Corpus) -> None:
    """Build in a temporary sibling directory, then rename: readers see all three files or none."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache.parent, prefix=f".{cache.name}."))
    except OSError:
        return  # a read-only home: the cache is an optimisation, not a requirement
    try:
        np.save(tmp / "train.npy", corpus.train)
        np.save(tmp / "val.npy", corpus.val)
        (tmp / "meta.json").write_text(json.dumps({"fingerprint": corpus.fingerprint, "bytes": corpus.bytes}))
        os.replace(tmp, cache)
    except OSError:  # another process won the rename (its copy is complete), or the disk is full
        shutil.rmtree(tmp, ignore_errors=True)


def _tail_split(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n_val = max(1, tokens.size * VALIDATION_PER_MILLE // 1000)
    return tokens[:-n_val], tokens[-n_val:]


# ---------------------------------------------------------------- token arrays


def _array_corpus(source: str, path: Path) -> Corpus:
    try:
        tokens = np.load(path) if path.suffix == ".npy" else np.fromfile(path, dtype="<u2")
    except (OSError, ValueError) as e:
        raise ConfigError("data.source", source, f"a readable .npy or uint16 .bin token array ({e})") from None
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer) or tokens.size < 2:
        raise ConfigError("data.source", source, "a 1-D integer token array with at least 2 tokens")
    if tokens.min() < 0 or tokens.max() >= 2**31:
        raise ConfigError("data.source", source, "token ids in [0, 2**31)")
    vocab = -(-(int(tokens.max()) + 1) // 64) * 64
    fingerprint = hashlib.sha256(str(tokens.dtype).encode() + np.ascontiguousarray(tokens).tobytes()).hexdigest()
    train, val = _tail_split(tokens)
    return Corpus(source, train, val, vocab, fingerprint, int(tokens.nbytes))


# ---------------------------------------------------------------- synthetic Markov chain


@functools.lru_cache(maxsize=4)
def synthetic_corpus(seed: int = 0, n_tokens: int = SYNTHETIC_TOKENS) -> Corpus:
    """A first-order Markov chain over 256 bytes: each byte has 8 successors with Dirichlet(1) weights.

    Entropy rate H = -sum_s pi(s) sum_t P(s,t) ln P(s,t) (pi = stationary distribution, from the
    empirical state frequencies of the sample) is the loss a perfect model reaches.
    """
    rng = np.random.default_rng(seed)
    successors = np.stack([rng.choice(BYTE_VOCAB, SYNTHETIC_SUCCESSORS, replace=False) for _ in range(BYTE_VOCAB)])
    weights = rng.dirichlet(np.ones(SYNTHETIC_SUCCESSORS), size=BYTE_VOCAB)
    draws = rng.random(n_tokens)
    cdf = np.cumsum(weights, axis=1)
    tokens = np.empty(n_tokens, dtype=np.uint8)
    state = 0
    succ, cdf_rows = successors.tolist(), cdf.tolist()
    for i, u in enumerate(draws.tolist()):
        row = cdf_rows[state]
        j = 0
        while j < SYNTHETIC_SUCCESSORS - 1 and u > row[j]:
            j += 1
        state = succ[state][j]
        tokens[i] = state
    counts = np.bincount(tokens, minlength=BYTE_VOCAB) / n_tokens
    entropy = float(-(counts[:, None] * weights * np.log(weights)).sum())
    fingerprint = hashlib.sha256(b"synthetic" + tokens.tobytes()).hexdigest()
    train, val = tokens[:-SYNTHETIC_VAL_TOKENS], tokens[-SYNTHETIC_VAL_TOKENS:]
    return Corpus("synthetic", train, val, BYTE_VOCAB, fingerprint, n_tokens, entropy_rate=entropy)


# ---------------------------------------------------------------- batches


def batch(tokens: np.ndarray, seed: int, step: int, batch_size: int, seq_len: int) -> np.ndarray:
    """Training batch `step` of run `seed`: int32 [batch_size, seq_len + 1] windows at random offsets.

    The offsets come from a counter-based generator keyed by (seed, step) (Philox), so batch k is
    the same whether the run got there in one go or was restarted, and costs O(batch) to draw.
    """
    return _windows(tokens, _generator(seed, step), batch_size, seq_len)


def train_sample(tokens: np.ndarray, n_tokens: int, seq_len: int) -> np.ndarray:
    """A fixed sample of training windows (the same for every run) to measure train loss on."""
    n_windows = max(1, n_tokens // seq_len)
    return _windows(tokens, _generator(_TRAIN_SAMPLE_KEY, 0), n_windows, seq_len)


def _generator(word0: int, word1: int) -> np.random.Generator:
    """Philox keyed by two 64-bit words: a fresh, independent stream per (word0, word1)."""
    return np.random.Generator(np.random.Philox(key=np.array([word0, word1], dtype=np.uint64)))


def _windows(tokens: np.ndarray, rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    if tokens.size < seq_len + 1:
        raise ConfigError("model.seq_len", seq_len, f"at most {tokens.size - 1} for this corpus")
    offsets = rng.integers(0, tokens.size - seq_len, size=n)
    return tokens[offsets[:, None] + np.arange(seq_len + 1)].astype(np.int32)


def eval_windows(tokens: np.ndarray, eval_tokens: int, seq_len: int) -> np.ndarray:
    """Held-out windows spread evenly over the whole split, non-overlapping; int32 [n, seq_len + 1].

    n = eval_tokens // L windows; window i covers tokens[i*s : i*s + L + 1] with stride
    s = (size - 1) // n >= L, so no target is predicted twice and every part of the split is
    sampled (its first files alone can be far from typical: on the stdlib corpus the first 64k
    validation bytes compress to 0.21 of their size, the whole split to 0.23, train text to 0.25).
    Asking for the whole split gives s = L: contiguous windows sharing one token.
    """
    n = eval_tokens // seq_len
    if n < 1 or n * seq_len + 1 > tokens.size:
        raise ConfigError("data.eval_tokens", eval_tokens,
                          f"between {seq_len} (model.seq_len) and {tokens.size - 1} (the validation split)")
    starts = np.arange(n) * ((tokens.size - 1) // n)
    return tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int32)
