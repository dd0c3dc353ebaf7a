"""Corpora as token arrays, and deterministic batches from (seed, step). Details: docs/data.md.

Sources (`data.source` in a run config):

- ``"stdlib"`` (default, no download): the running interpreter's own standard-library ``*.py``
  files, without ``site-packages`` and test directories (about 12 MB of text written by people).
- ``"pysrc"``: every ``*.py`` file the running interpreter can import: the standard library and
  the installed packages. Its roots are the ``sys.path`` directories of the installation (under
  ``sys.prefix`` / ``sys.base_prefix`` / ``sys.exec_prefix``, or a site-packages directory),
  deduplicated by resolved path; the working directory and ``PYTHONPATH`` checkouts (this project's
  own source among them) are left out, so the corpus does not depend on where or how the process
  was started. Test directories are skipped as for stdlib; a relative path (to its root) found
  under two roots is taken from the first, as import would. On the development machine (Python
  3.11.7 and the project's venv, a busy 2-core AMD EPYC): 148 MB in 10,451 files; building its cache
  takes 2.1-2.4 s (files in the page cache; peak RSS 75 MB), a cached load 0.6-1.4 s (the directory
  walk and stat listing that key the cache; the arrays are memory-mapped, not read).
- a path to a text file or a directory of text files (every regular file, recursively;
  hidden files and directories skipped).
- a path to a pre-tokenised array: ``.npy`` (any integer dtype) or raw little-endian ``.bin``:
  ``uint16`` as nanoGPT writes it, ``uint32`` when the name ends in ``.u32.bin``. Arrays are
  memory-mapped, never read whole (they may be larger than memory): the fingerprint and the token
  range are computed in chunks (and cached by path, size and mtime), the splits are views of the
  map and batches gather their windows from it. vocab = largest token + 1, rounded up to a
  multiple of 64.
- ``"synthetic"``: a seeded random first-order Markov chain over bytes whose entropy rate
  (the best achievable loss) is known; small and learnable, for tests.

Tokenizers (`data.tokenizer`, for text sources: stdlib, pysrc, text files):

- ``"bytes"`` (default): one token per byte, vocab 256.
- ``"bpe:V"`` (257 <= V <= 65536): a byte-level BPE (HF ``tokenizers``: GPT-2's byte alphabet and
  pre-tokenizer split, no special tokens) of at most V tokens, trained on the TRAINING split only:
  on every k-th training file in path order, k chosen so the sample is about BPE_SAMPLE_BYTES
  (32 MiB; the whole split when smaller), then applied to every file of both splits (each file
  tokenised on its own, the results concatenated as the byte corpus concatenates files). Files are
  decoded as UTF-8 with undecodable bytes replaced by U+FFFD. The model's vocab is V even if the
  text gave fewer merges. Cached by (text fingerprint, V, sample size) as tokenizer.json, the
  tokenised splits (uint16 .npy) and each token's byte length; runs record the tokenizer and the
  sha256 of its tokenizer.json. Tokenising is the slow part: pysrc with bpe:4096 took 194 s on the
  2-core machine (training on the 29 MB sample about 20 s, tokenising 148 MB at about 0.9 MB/s; peak
  RSS 520 MB), 3.18 bytes per token; a cached load takes 0.9 s.

Bits per byte: `Corpus.token_bytes[t]` is the number of bytes token t decodes to (1 for byte
tokens; None for pre-tokenised arrays, whose text is unknown). An evaluation's loss in bits per
byte is loss x targets / (bytes x ln 2), with `target_bytes` counting the bytes its target tokens
decode to; for byte tokens that is loss / ln 2.

Train/validation split: for file sources a FIXED split by file (a file is validation when
``sha256(relative path) mod 1000 < 20``, about 2%), so adding or removing other files never
moves a file between splits (a single file, or a few files all on one side, fall back to the
tail split); token arrays hold out their last 2%, the synthetic chain its last 65537 tokens.

Fingerprint: sha256 over sha256(relative path) || sha256(content) of every file in path order
(for arrays: over dtype and bytes), recorded with the byte count in every run, so results are
tied to the exact text (another Python version's stdlib is another corpus).
File corpora are cached under ``$SCALING_CACHE`` (default ``~/.cache/scaling``) as .npy files,
keyed by a stat listing (path, size, mtime) of the source: built streaming (each file read once
and appended to its split's file on disk), renamed into place whole, and loaded memory-mapped.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import shutil
import site
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import numpy as np

from scaling._io import atomic_write_json
from scaling.errors import ConfigError

BYTE_VOCAB = 256
VALIDATION_PER_MILLE = 20  # ~2% of files (or of an array's tail) held out
SYNTHETIC_TOKENS = 1 << 20
SYNTHETIC_VAL_TOKENS = (1 << 16) + 1  # the default eval_tokens (65536) fits
SYNTHETIC_SUCCESSORS = 8  # each byte is followed by one of 8 bytes: learnable by a tiny model
BPE_SAMPLE_BYTES = 32 << 20  # text the BPE is trained on (its merges, not the tokenised corpus)
BPE_VOCAB_RANGE = (257, 65536)  # above the 256 byte tokens; ids fit uint16
TOKENIZER_ALLOWED = '"bytes", or "bpe:VOCAB" with VOCAB an integer from 257 to 65536'
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
_TRAIN_SAMPLE_KEY = 2**64 - 1  # Philox key word for the fixed train-loss sample (no run seed uses it)
_CHUNK = 1 << 24  # elements per chunk when scanning an array that may not fit in memory
_ENCODE_BATCH_BYTES = 1 << 20  # text per encode_batch call: ~70 files for its threads; 8 MiB batches took 400 MB
_BYTE_LENGTHS = np.ones(BYTE_VOCAB, dtype=np.int64)
_BYTE_LENGTHS.setflags(write=False)
_Read = TypeVar("_Read")  # what a cache directory is read as (a Corpus, the synthetic chain's tokens)


@dataclass(frozen=True)
class Corpus:
    """Tokens of one source, split once. `fingerprint` is the content hash, `bytes` the source size."""

    source: str
    train: np.ndarray  # 1-D: uint8 (bytes), uint16 (BPE), any integer dtype (token arrays); often a np.memmap
    val: np.ndarray
    vocab: int
    fingerprint: str
    bytes: int
    entropy_rate: float | None = None  # nats/token; known only for the synthetic chain
    tokenizer: str = "bytes"  # "bytes", "bpe:V", or "array" (pre-tokenised: no tokenizer known)
    tokenizer_json: str | None = None  # the BPE's tokenizer.json (tokenizers.Tokenizer.from_str)
    tokenizer_sha256: str | None = None
    token_bytes: np.ndarray | None = None  # bytes each token id decodes to; None: unknown (arrays)
    doc_starts: tuple[np.ndarray, np.ndarray] | None = None  # where each file starts in train, val

    def __post_init__(self) -> None:
        # Corpora are shared (cached per process): nobody may write into them.
        self.train.setflags(write=False)
        self.val.setflags(write=False)

    def describe(self) -> dict:
        """What a run records about its data."""
        described = {"source": self.source, "fingerprint": self.fingerprint, "bytes": self.bytes,
                     "vocab": self.vocab, "tokenizer": self.tokenizer, "train_tokens": int(self.train.size),
                     "val_tokens": int(self.val.size)}
        if self.tokenizer_sha256:
            described["tokenizer_sha256"] = self.tokenizer_sha256
        return described


def check_fingerprint(corpus: Corpus, pinned: str) -> None:
    """ConfigError unless the corpus is the pinned one (data.fingerprint; "" pins nothing)."""
    if pinned and not corpus.fingerprint.startswith(pinned):
        raise ConfigError("data.fingerprint", pinned, f"the fingerprint of the corpus data.source = {corpus.source!r} "
                          f"resolves to here, {corpus.fingerprint[:12]} (another installation or checkout path "
                          "is other data: train where the pinned corpus is, or pin this one)")


def load(source: str, tokenizer: str = "bytes") -> Corpus:
    """The corpus named by `data.source`, tokenised by `data.tokenizer` (see the module docstring);
    bad values raise ConfigError."""
    vocab = tokenizer_vocab(tokenizer, source)
    if source == "synthetic":
        return synthetic_corpus()
    if source == "stdlib":
        corpus = _file_corpus("stdlib", _stdlib_files())
    elif source == "pysrc":
        corpus = _file_corpus("pysrc", _pysrc_files())
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise ConfigError("data.source", source, '"stdlib", "pysrc", "synthetic", or an existing file or directory')
        if _is_token_array(path):
            return _array_corpus(source, path)
        corpus = _file_corpus(source, _text_files(path.resolve()))
    return corpus if vocab is None else _bpe_corpus(corpus, vocab)


def tokenizer_vocab(tokenizer: object, source: str | None = None) -> int | None:
    """V for "bpe:V", None for "bytes"; ConfigError naming data.tokenizer for anything else, and for
    a BPE over a `source` that is not text (the synthetic chain, pre-tokenised arrays)."""
    if tokenizer == "bytes":
        return None
    match = re.fullmatch(r"bpe:(\d+)", tokenizer) if isinstance(tokenizer, str) else None
    if not match or not BPE_VOCAB_RANGE[0] <= int(match[1]) <= BPE_VOCAB_RANGE[1]:
        raise ConfigError("data.tokenizer", tokenizer, TOKENIZER_ALLOWED)
    if source == "synthetic" or (source is not None and _is_token_array(Path(source).expanduser())):
        raise ConfigError("data.tokenizer", tokenizer,
                          f'"bytes" for data.source = {source!r} (a BPE needs text: stdlib, pysrc, text files)')
    return int(match[1])


def _is_token_array(path: Path) -> bool:
    return path.suffix in (".npy", ".bin") and path.is_file()


# ---------------------------------------------------------------- file corpora (stdlib, pysrc, text)


def _stdlib_files() -> list[tuple[str, Path]]:
    """(path relative to the stdlib root, path) of the standard library's *.py files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [(str(f.relative_to(root)), f) for f in _walk(root) if f.suffix == ".py"]


def pysrc_roots() -> list[Path]:
    """The sys.path directories of this installation (stdlib, lib-dynload, site-packages), in import
    order: entries outside it (the working directory, PYTHONPATH checkouts) would make the corpus
    depend on where and how the process was started."""
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    site_dirs = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    cwd, roots = Path.cwd().resolve(), []
    for entry in sys.path:
        path = Path(entry).resolve() if entry else cwd  # "" is the working directory
        installed = path in site_dirs or any(path.is_relative_to(p) for p in prefixes)
        if installed and path != cwd and path.is_dir() and path not in roots:
            roots.append(path)
    return roots


def _pysrc_files() -> list[tuple[str, Path]]:
    roots, files = pysrc_roots(), {}
    for root in roots:
        nested = {r for r in roots if r != root and r.is_relative_to(root)}  # walked as roots of their own
        for f in _walk(root, skip=nested):
            if f.suffix == ".py":
                files.setdefault(str(f.relative_to(root)), f)  # the first root wins, as for import
    return sorted(files.items())


def _text_files(path: Path) -> list[tuple[str, Path]]:
    if path.is_file():
        return [(path.name, path)]
    return [(str(f.relative_to(path)), f) for f in _walk(path)]


def _walk(root: Path, skip: set[Path] = frozenset()) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS and not d.startswith(".")
                             and Path(dirpath, d) not in skip)
        files += [Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")]
    return [f for f in files if f.is_file()]


def is_validation_file(relpath: str) -> bool:
    """The fixed by-file split: a stable hash of the relative path, never a random draw."""
    digest = hashlib.sha256(relpath.encode()).digest()
    return int.from_bytes(digest[:8], "little") % 1000 < VALIDATION_PER_MILLE


def _file_corpus(source: str, files: list[tuple[str, Path]]) -> Corpus:
    stats = [(rel, str(f), s.st_size, s.st_mtime_ns) for rel, f in files for s in [f.stat()]]
    if not any(size for _, _, size, _ in stats):
        raise ConfigError("data.source", source, "a file or a directory holding at least one non-empty file")
    key = hashlib.sha256(json.dumps(["bytes-v2", sorted(stats)]).encode()).hexdigest()[:16]

    def read(directory: Path, mmap: bool) -> Corpus:
        meta = json.loads((directory / "meta.json").read_text())
        train, val, train_starts, val_starts = (_npy(directory, name, mmap) for name in
                                                ("train", "val", "train_starts", "val_starts"))
        return Corpus(source, train, val, BYTE_VOCAB, meta["fingerprint"], meta["bytes"],
                      token_bytes=_BYTE_LENGTHS, doc_starts=(train_starts, val_starts))

    return _cached(cache_dir() / f"corpus-{key}", lambda tmp: _build_bytes(sorted(files), tmp), read)


def _build_bytes(files: list[tuple[str, Path]], tmp: Path) -> None:
    """Each file read once, hashed and appended to its split's raw file; then the .npy splits."""
    digest, sizes = hashlib.sha256(), ([], [])  # file sizes in train, val
    raws = (tmp / "train.raw", tmp / "val.raw")
    with open(raws[0], "wb") as train_out, open(raws[1], "wb") as val_out:
        for rel, f in files:
            content = f.read_bytes()
            digest.update(hashlib.sha256(rel.encode()).digest() + hashlib.sha256(content).digest())
            side = int(is_validation_file(rel))
            (train_out, val_out)[side].write(content)
            sizes[side].append(len(content))
    n_train, n_val = sum(sizes[0]), sum(sizes[1])
    if n_train and n_val:
        parts = {"train": (raws[0], 0, n_train, _starts(sizes[0])), "val": (raws[1], 0, n_val, _starts(sizes[1]))}
    else:  # a single file or a tiny directory, all on one side: fall back to a tail split of that side
        side = 0 if n_train else 1
        starts, total = _starts(sizes[side]), n_train + n_val
        cut = total - max(1, total * VALIDATION_PER_MILLE // 1000)
        parts = {"train": (raws[side], 0, cut, starts[starts < cut]),
                 "val": (raws[side], cut, total, np.concatenate([[0], starts[starts > cut] - cut]))}
    for name, (raw, begin, end, starts) in parts.items():
        _raw_to_npy(raw, begin, end, np.dtype(np.uint8), tmp / f"{name}.npy")
        np.save(tmp / f"{name}_starts.npy", starts.astype(np.int64))
    for raw in raws:
        raw.unlink()
    (tmp / "meta.json").write_text(json.dumps({"fingerprint": digest.hexdigest(), "bytes": n_train + n_val}))


def _starts(sizes: list[int]) -> np.ndarray:
    return np.cumsum([0, *sizes[:-1]], dtype=np.int64)


def _raw_to_npy(raw: Path, begin: int, end: int, dtype: np.dtype, dest: Path) -> None:
    """Bytes [begin, end) of a raw file as a 1-D .npy of `dtype`, copied in chunks (never whole in memory)."""
    with open(raw, "rb") as src, open(dest, "wb") as out:
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                  "shape": ((end - begin) // dtype.itemsize,)}
        np.lib.format.write_array_header_1_0(out, header)
        src.seek(begin)
        remaining = end - begin
        while remaining:
            chunk = src.read(min(remaining, _CHUNK))
            if not chunk:
                raise OSError(f"{raw} ended {remaining} bytes early")
            out.write(chunk)
            remaining -= len(chunk)


def _npy(directory: Path, name: str, mmap: bool) -> np.ndarray:
    return np.load(directory / f"{name}.npy", mmap_mode="r" if mmap else None)


def cache_dir() -> Path:
    return Path(os.environ.get("SCALING_CACHE", Path.home() / ".cache" / "scaling"))


def use_compilation_cache() -> None:
    """This process's JAX keeps what it compiles for a second or more under cache_dir()/jax (XLA's
    persistent compilation cache; on a GPU the autotune results beside it), unless the user chose a
    directory: the next process compiling the same program loads it instead (a training step, a
    law's fit)."""
    import jax  # lazy: the corpora need no JAX

    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def _cached(cache: Path, build: Callable[[Path], None], read: Callable[[Path, bool], _Read]) -> _Read:
    """`read(cache, mmap=True)`, building the directory first if it is missing: `build(tmp)` fills a
    temporary sibling (meta.json last), renamed into place, so readers see a whole directory or none."""
    if not (cache / "meta.json").is_file():
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=cache.parent, prefix=f".{cache.name}."))
        except OSError:  # a read-only cache location: build in the system's temp dir, read into memory
            with tempfile.TemporaryDirectory(prefix="scaling-") as scratch:
                build(Path(scratch))
                return read(Path(scratch), False)
        try:
            build(tmp)
            os.replace(tmp, cache)
        except OSError:
            if not (cache / "meta.json").is_file():  # not another process winning the rename: a real failure
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return read(cache, True)


# ---------------------------------------------------------------- byte-level BPE


def _bpe_corpus(text: Corpus, vocab: int) -> Corpus:
    key = hashlib.sha256(json.dumps(["bpe-v1", text.fingerprint, vocab, BPE_SAMPLE_BYTES]).encode()).hexdigest()[:16]

    def read(directory: Path, mmap: bool) -> Corpus:
        meta = json.loads((directory / "meta.json").read_text())
        return Corpus(text.source, _npy(directory, "train", mmap), _npy(directory, "val", mmap), vocab,
                      text.fingerprint, text.bytes, tokenizer=f"bpe:{vocab}",
                      tokenizer_json=(directory / "tokenizer.json").read_text(),
                      tokenizer_sha256=meta["tokenizer_sha256"], token_bytes=np.load(directory / "token_bytes.npy"))

    return _cached(cache_dir() / f"bpe-{key}", lambda tmp: _build_bpe(text, vocab, tmp), read)


def _build_bpe(text: Corpus, vocab: int, tmp: Path) -> None:
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise ConfigError("data.tokenizer", f"bpe:{vocab}", '"bytes", or install the `tokenizers` package') from None
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    train_docs = _documents(text.train, text.doc_starts[0])
    stride = max(1, -(-text.train.size // BPE_SAMPLE_BYTES))  # every k-th file: spread over the whole split
    tokenizer.train_from_iterator((_decode(text.train[a:b]) for a, b in train_docs[::stride]), trainer)
    tokenizer.save(str(tmp / "tokenizer.json"))
    dtype = np.dtype(np.uint16)  # BPE_VOCAB_RANGE keeps every id below 2**16
    for name, tokens, starts in (("train", text.train, text.doc_starts[0]), ("val", text.val, text.doc_starts[1])):
        raw, count = tmp / f"{name}.raw", 0
        with open(raw, "wb") as out:
            for batch in _batches(_documents(tokens, starts)):
                encodings = tokenizer.encode_batch_fast([_decode(tokens[a:b]) for a, b in batch])
                ids = np.concatenate([np.asarray(e.ids, dtype=dtype) for e in encodings])
                ids.tofile(out)
                count += ids.size
        _raw_to_npy(raw, 0, count * dtype.itemsize, dtype, tmp / f"{name}.npy")
        raw.unlink()
    # Byte-level tokens are strings over a 256-character alphabet, one character per byte.
    lengths = np.zeros(vocab, dtype=np.int64)
    for token, i in tokenizer.get_vocab().items():
        lengths[i] = len(token)
    np.save(tmp / "token_bytes.npy", lengths)
    sha = hashlib.sha256((tmp / "tokenizer.json").read_bytes()).hexdigest()
    (tmp / "meta.json").write_text(json.dumps({"tokenizer_sha256": sha, "sample_stride": stride}))


def _documents(tokens: np.ndarray, starts: np.ndarray) -> list[tuple[int, int]]:
    """[begin, end) of each file in a split."""
    ends = [*starts[1:].tolist(), tokens.size]
    return list(zip(starts.tolist(), ends))


def _batches(documents: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
    """Consecutive documents, about _ENCODE_BATCH_BYTES of text per batch."""
    batch, size = [], 0
    for a, b in documents:
        batch.append((a, b))
        size += b - a
        if size >= _ENCODE_BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _decode(byte_tokens: np.ndarray) -> str:
    return byte_tokens.tobytes().decode("utf-8", errors="replace")


# ---------------------------------------------------------------- token arrays


def _array_corpus(source: str, path: Path) -> Corpus:
    """A memory-mapped token array: scanned in chunks once per (path, size, mtime), then only mapped."""
    try:
        if path.suffix == ".npy":
            tokens = np.load(path, mmap_mode="r")
        else:
            tokens = np.memmap(path, dtype="<u4" if path.name.endswith(".u32.bin") else "<u2", mode="r")
    except (OSError, ValueError) as e:
        raise ConfigError("data.source", source, f"a readable .npy, uint16 .bin or uint32 .u32.bin token array ({e})") from None
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer) or tokens.size < 2:
        raise ConfigError("data.source", source, "a 1-D integer token array with at least 2 tokens")
    stat = path.stat()
    key = hashlib.sha256(json.dumps(["array-v1", str(path.resolve()), stat.st_size, stat.st_mtime_ns]).encode())
    scan_file = cache_dir() / f"array-{key.hexdigest()[:16]}.json"
    try:
        scan = json.loads(scan_file.read_text())
    except (OSError, ValueError):
        scan = _scan(tokens)
        try:
            atomic_write_json(scan_file, scan)
        except OSError:
            pass  # a read-only cache: scan again next time
    if scan["min"] < 0 or scan["max"] >= 2**31:
        raise ConfigError("data.source", source, "token ids in [0, 2**31)")
    vocab = -(-(scan["max"] + 1) // 64) * 64
    train, val = _tail_split(tokens)
    return Corpus(source, train, val, vocab, scan["fingerprint"], int(tokens.nbytes), tokenizer="array")


def _scan(tokens: np.ndarray) -> dict:
    """sha256 over the dtype and the bytes (as if hashed whole), and the token range, chunk by chunk."""
    digest, lo, hi = hashlib.sha256(str(tokens.dtype).encode()), None, None
    for begin in range(0, tokens.size, _CHUNK):
        chunk = np.ascontiguousarray(tokens[begin:begin + _CHUNK])
        digest.update(chunk.view(np.uint8))
        lo = int(chunk.min()) if lo is None else min(lo, int(chunk.min()))
        hi = int(chunk.max()) if hi is None else max(hi, int(chunk.max()))
    return {"fingerprint": digest.hexdigest(), "min": lo, "max": hi}


def _tail_split(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n_val = max(1, tokens.size * VALIDATION_PER_MILLE // 1000)
    return tokens[:-n_val], tokens[-n_val:]


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
    tokens = _cached_chain(successors, cdf, draws)
    counts = np.bincount(tokens, minlength=BYTE_VOCAB) / n_tokens
    entropy = float(-(counts[:, None] * weights * np.log(weights)).sum())
    fingerprint = hashlib.sha256(b"synthetic" + tokens.tobytes()).hexdigest()
    train, val = tokens[:-SYNTHETIC_VAL_TOKENS], tokens[-SYNTHETIC_VAL_TOKENS:]
    return Corpus("synthetic", train, val, BYTE_VOCAB, fingerprint, n_tokens, entropy_rate=entropy,
                  token_bytes=_BYTE_LENGTHS)


def _markov_chain(successors: np.ndarray, cdf: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """The chain's bytes from state 0: at each draw u, the first successor whose cumulative weight is
    not below u (the last one if u is above all but it)."""
    tokens = np.empty(len(draws), dtype=np.uint8)
    state = 0
    succ, cdf_rows = successors.tolist(), cdf.tolist()
    for i, u in enumerate(draws.tolist()):
        row = cdf_rows[state]
        j = 0
        while j < SYNTHETIC_SUCCESSORS - 1 and u > row[j]:
            j += 1
        state = succ[state][j]
        tokens[i] = state
    return tokens


def _cached_chain(successors: np.ndarray, cdf: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """_markov_chain, kept under cache_dir() keyed by everything it reads (the successors, their
    cumulative weights, every draw): its step-by-step loop took about a second in every process that
    loads the synthetic corpus (each run of a sweep, each CLI call), reading the cache a millisecond.
    A cached file whose bytes no longer hash to what was written is recomputed, not trusted."""
    key = hashlib.sha256(b"synthetic-chain-v1" + successors.astype(np.int64).tobytes() + cdf.tobytes()
                         + draws.tobytes()).hexdigest()[:16]

    def build(tmp: Path) -> None:
        tokens = _markov_chain(successors, cdf, draws)
        np.save(tmp / "tokens.npy", tokens)
        (tmp / "meta.json").write_text(json.dumps({"sha256": hashlib.sha256(tokens.tobytes()).hexdigest()}))

    def read(directory: Path, mmap: bool) -> np.ndarray:
        try:
            tokens = np.load(directory / "tokens.npy")
            expected = json.loads((directory / "meta.json").read_text())["sha256"]
        except (OSError, ValueError, KeyError):
            return _markov_chain(successors, cdf, draws)
        if (tokens.dtype != np.uint8 or tokens.shape != draws.shape
                or hashlib.sha256(tokens.tobytes()).hexdigest() != expected):
            return _markov_chain(successors, cdf, draws)
        return tokens

    return _cached(cache_dir() / f"synthetic-{key}", build, read)


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


# ---------------------------------------------------------------- bits per byte


def target_bytes(windows: np.ndarray, token_bytes: np.ndarray | None) -> int | None:
    """Bytes the target tokens (all but each window's first) of int [n, L + 1] windows decode to;
    None when the corpus does not know what its tokens decode to (pre-tokenised arrays)."""
    if token_bytes is None:
        return None
    return int(token_bytes[windows[:, 1:]].sum())


def bits_per_byte(loss: float, windows: np.ndarray, n_bytes: int | None) -> float | None:
    """A mean loss in nats per target token over `windows` as bits per byte of the text those targets
    decode to: loss x targets / (bytes x ln 2). Tokenizer-independent, so corpora and tokenizers compare."""
    if not n_bytes:
        return None
    return loss * windows[:, 1:].size / (n_bytes * math.log(2))
