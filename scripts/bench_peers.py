"""The tools that scripts/bench_encode.py measures: how each is built offline for an encoding, and
the exact calls with which it encodes documents.

Every tool is built from the same files, never downloaded: GPT-2's `tests/fixtures/gpt2_vocab.json`
(+ `gpt2_merges.txt`), or the `.tiktoken` rank files of cl100k_base and o200k_base in the shared
fixtures. The reference, tiktoken, is built exactly as `tiktoken_ext/openai_public.py` builds the
encoding (its pattern, ranks and special tokens), with that module's downloads served from those
files (their SHA-256 checked as tiktoken checks them). A built tool is an `Encoder`:

- `one(doc)`: one document on the calling thread (the 1-thread runs);
- `batch(docs)`: a list of documents through the tool's own batch API on `threads` threads
  (the multi-thread runs), or None if the tool has no such API;

returning the ids of each document, or `(flat ids, offsets)` with document i's ids at
`flat[offsets[i]:offsets[i + 1]]`. The documents are ordinary text: no tool is asked to
recognise special tokens. `one_api` and `batch_api` spell out the calls, for the report.
Packages are imported inside the builders (numpy too), so that a measuring process can pin its
CPUs before any library starts a thread.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2_VOCAB = os.path.join(ROOT, "tests", "fixtures", "gpt2_vocab.json")
GPT2_MERGES = os.path.join(ROOT, "tests", "fixtures", "gpt2_merges.txt")
# The shared fixtures: beside the checkout (as in CI), or where the development machines have them.
TIKTOKEN_DIRS = (os.path.join(os.path.dirname(ROOT), "shared", "fixtures", "tiktoken"),
                 "/work/shared/fixtures/tiktoken")
EOT = "<|endoftext|>"
WARM_UP = ["Warm-up, 123: load or compile the kernels. ünïcödé 🙂\n", "a second one\n"]

ENCODINGS = ("gpt2", "cl100k", "o200k")
TIKTOKEN_NAMES = dict(gpt2="gpt2", cl100k="cl100k_base", o200k="o200k_base")
# The tools built from GPT-2's files (all but hf also from cl100k's and o200k's); the notebook's
# `bench_encode.measure_encoding` runs these.
TOOLS = ("nbbpe", "nbbpe_list", "nbbpe_regex", "tiktoken", "gigatoken", "fastokens", "hf")
# With the OpenAI encodings built in, so for cl100k and o200k only.
OPENAI_TOOLS = ("bpe_openai", "quicktok")
# `regex.findall` of the encoding's pattern: what pre-tokenizing alone costs (no ids).
YARDSTICK = "findall"
ALL_TOOLS = TOOLS + OPENAI_TOOLS + (YARDSTICK,)
PEERS = ("tiktoken", "gigatoken", "fastokens", "hf", "bpe_openai", "quicktok")
TOOL_MODULES = dict(nbbpe="nbbpe", nbbpe_list="nbbpe", nbbpe_regex="nbbpe", tiktoken="tiktoken",
                    gigatoken="gigatoken", fastokens="fastokens", hf="tokenizers",
                    bpe_openai="bpe_openai", quicktok="quicktok", findall="regex")
TOOL_ENCODINGS = dict(hf=("gpt2",), bpe_openai=("cl100k", "o200k"), quicktok=("cl100k", "o200k"))


class Unsupported(Exception):
    """The tool cannot be built for this encoding here (the message says why)."""


@dataclass
class Encoder:
    one: Callable[[str], object]
    batch: Callable[[list[str]], object] | None
    one_api: str
    batch_api: str
    # The one-text call as `tok.method(doc)` finds it at the time of the call, for a tool whose
    # instance replaces its method once warmed up (nbbpe's own calls, from the short path's
    # first text on: `Tokenizer._make_own_calls`).
    look_up_one: Callable[[], Callable[[str], object]] | None = None

    def __post_init__(self):
        self._built_one = self.one

    def warmed_up(self) -> None:
        """Call after the warm-up: `one` is then what `tok.method(doc)` calls from now on
        (unless the caller has put something else in its place, e.g. a wrapper)."""
        if self.look_up_one is not None and self.one is self._built_one:
            self.one = self.look_up_one()


def tool_available(name: str) -> bool:
    """Whether the tool's package can be imported here (without importing it)."""
    return importlib.util.find_spec(TOOL_MODULES[name]) is not None


def supports(name: str, encoding: str) -> bool:
    return encoding in TOOL_ENCODINGS.get(name, ENCODINGS)


def build(name: str, encoding: str, threads: int) -> Encoder:
    """A fresh instance of the tool for `encoding`; its batch API runs on `threads` threads."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, not {encoding!r}")
    if not supports(name, encoding):
        raise Unsupported(f"{name} is built here for {', '.join(TOOL_ENCODINGS[name])} only")
    return BUILDERS[name](encoding, threads)


# --- files ------------------------------------------------------------------------------------


def tiktoken_file(encoding: str) -> str:
    name = f"{TIKTOKEN_NAMES[encoding]}.tiktoken"
    for directory in TIKTOKEN_DIRS:
        if os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    raise FileNotFoundError(f"{name} is in none of {TIKTOKEN_DIRS}")


def openai_spec(encoding: str) -> dict:
    """tiktoken's constructor arguments for the encoding, from `tiktoken_ext.openai_public`,
    whose two loaders read the local files instead of downloading."""
    from unittest import mock

    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext import openai_public

    def local_rank_file(url, expected_hash=None):
        assert url.endswith(f"/{TIKTOKEN_NAMES[encoding]}.tiktoken"), url
        return load_tiktoken_bpe(tiktoken_file(encoding), expected_hash)

    def local_gpt2_files(vocab_bpe_file, encoder_json_file, vocab_bpe_hash, encoder_json_hash):
        return gpt2_ranks(encoder_json_hash)

    with mock.patch.object(openai_public, "load_tiktoken_bpe", local_rank_file), \
            mock.patch.object(openai_public, "data_gym_to_mergeable_bpe_ranks", local_gpt2_files):
        return openai_public.ENCODING_CONSTRUCTORS[TIKTOKEN_NAMES[encoding]]()


def gpt2_ranks(expected_hash: str) -> dict[bytes, int]:
    """GPT-2's ranks: the ids of its encoder.json (tiktoken's loader finds the same, checking them
    against the merges), whose keys spell bytes with GPT-2's byte-to-character map."""
    with open(GPT2_VOCAB, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != expected_hash:
        raise ValueError(f"{GPT2_VOCAB} is not GPT-2's encoder.json (its SHA-256 differs)")
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in printable]
    byte_of = {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}
    return {bytes(byte_of[c] for c in token): i for token, i in json.loads(data).items() if token != EOT}


@contextmanager
def gpt2_tokenizer_json():
    """The path of GPT-2's tokenizer.json as Hugging Face writes it (BPE from the vocab and
    merges, the ByteLevel pre-tokenizer with its built-in GPT-2 regex), in a temporary directory
    for the time of the `with`. The Rust tools recognise this form; a `Split` with the same regex
    sends fastokens to a slower path."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise Unsupported("GPT-2's tokenizer.json is written with Hugging Face `tokenizers`, "
                          "which is not installed") from None
    tokenizer = Tokenizer(models.BPE.from_file(GPT2_VOCAB, GPT2_MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as directory:
        path = os.path.join(directory, "tokenizer.json")
        tokenizer.save(path)
        yield path


# --- the tools --------------------------------------------------------------------------------


def _nbbpe(encoding: str, threads: int, *, numpy: bool = True, pretokenizer: str = "auto") -> Encoder:
    from nbbpe import Tokenizer

    options = {} if pretokenizer == "auto" else {"pretokenizer": pretokenizer}
    option_text = "" if pretokenizer == "auto" else f", pretokenizer={pretokenizer!r}"
    if encoding == "gpt2":
        tok = Tokenizer.from_files(GPT2_VOCAB, GPT2_MERGES, [EOT], **options)
    elif hasattr(Tokenizer, "from_tiktoken_file"):
        from nbbpe import patterns

        pattern = patterns.CL100K_PATTERN if encoding == "cl100k" else patterns.O200K_PATTERN
        tok = Tokenizer.from_tiktoken_file(tiktoken_file(encoding), pattern, **options)
    else:
        raise Unsupported("this nbbpe has no Tokenizer.from_tiktoken_file yet")
    one_name, batch_name = ("encode_to_numpy", "encode_batch_to_numpy") if numpy else ("encode", "encode_batch")
    one = getattr(tok, one_name)
    if hasattr(tok, batch_name):
        batch_call = getattr(tok, batch_name)
        batch = lambda docs: batch_call(docs, num_threads=threads)  # noqa: E731
        batch_api = f"tok.{batch_name}(docs, num_threads={threads})"
    else:  # fallback until nbbpe has a batch API
        pool = ThreadPoolExecutor(threads)
        batch = lambda docs: list(pool.map(one, docs))  # noqa: E731
        batch_api = (f"list(ThreadPoolExecutor({threads}).map(tok.{one_name}, docs)) "
                     f"[fallback: this nbbpe has no {batch_name}]")
    return Encoder(one, batch, f"tok.{one_name}(doc){option_text}", batch_api,
                   lambda: getattr(tok, one_name))


def _tiktoken(encoding: str, threads: int) -> Encoder:
    import tiktoken

    enc = tiktoken.Encoding(**openai_spec(encoding))
    return Encoder(enc.encode_ordinary, lambda docs: enc.encode_ordinary_batch(docs, num_threads=threads),
                   "enc.encode_ordinary(doc)", f"enc.encode_ordinary_batch(docs, num_threads={threads})")


def _gigatoken(encoding: str, threads: int) -> Encoder:
    import gigatoken
    import numpy as np

    if encoding == "gpt2":
        with gpt2_tokenizer_json() as path, open(path, encoding="utf-8") as f:
            tok = gigatoken.Tokenizer.from_json(f.read())
        built = "Tokenizer.from_json(GPT-2 tokenizer.json)"
    else:
        tok = gigatoken.Tokenizer.from_tiktoken(tiktoken_file(encoding), pretokenizer=encoding, special_tokens={})
        built = f"Tokenizer.from_tiktoken(path, pretokenizer={encoding!r}, special_tokens={{}})"

    def batch(docs):  # an awkward Array: its flat ids and offsets, without copying
        layout = tok.encode_batch(docs, parallel=True).layout
        return np.asarray(layout.content.data), np.asarray(layout.offsets.data)

    return Encoder(tok.encode, batch, f"{built}; tok.encode(doc)", "tok.encode_batch(docs, parallel=True)")


def _fastokens(encoding: str, threads: int) -> Encoder:
    import fastokens
    import numpy as np

    if encoding == "gpt2":
        with gpt2_tokenizer_json() as path:
            tok = fastokens.Tokenizer.from_file(path)
        built = "Tokenizer.from_file(GPT-2 tokenizer.json)"
    else:  # the preset's pattern: tiktoken's spelling of cl100k's (possessive) runs on a slower path
        name = TIKTOKEN_NAMES[encoding]
        tok = fastokens.Tokenizer.from_tiktoken(tiktoken_file(encoding), encoding=name, special_tokens={})
        built = f"Tokenizer.from_tiktoken(path, encoding={name!r}, special_tokens={{}})"

    def batch(docs):
        ids, offsets = tok.encode_batch_flat(docs)
        return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64)

    return Encoder(lambda doc: tok.encode_ordinary(doc).ids, batch, f"{built}; tok.encode_ordinary(doc).ids",
                   "tok.encode_batch_flat(docs)")


def _hf(encoding: str, threads: int) -> Encoder:
    from tokenizers import Tokenizer

    with gpt2_tokenizer_json() as path:
        tok = Tokenizer.from_file(path)
    return Encoder(lambda doc: tok.encode(doc).ids, lambda docs: [e.ids for e in tok.encode_batch_fast(docs)],
                   "tok.encode(doc).ids", "[e.ids for e in tok.encode_batch_fast(docs)]")


def _bpe_openai(encoding: str, threads: int) -> Encoder:
    import bpe_openai

    enc = bpe_openai.get_encoding(TIKTOKEN_NAMES[encoding])
    return Encoder(enc.encode_ordinary, lambda docs: enc.encode_ordinary_batch(docs, num_threads=threads),
                   "enc.encode_ordinary(doc)", f"enc.encode_ordinary_batch(docs, num_threads={threads})")


def _quicktok(encoding: str, threads: int) -> Encoder:
    import quicktok

    enc = quicktok.get_encoding(TIKTOKEN_NAMES[encoding])
    return Encoder(enc.encode_ordinary, lambda docs: enc.encode_batch(docs, threads),
                   "enc.encode_ordinary(doc)", f"enc.encode_batch(docs, {threads})")


def _findall(encoding: str, threads: int) -> Encoder:
    import regex

    findall = regex.compile(openai_spec(encoding)["pat_str"]).findall
    return Encoder(findall, None, "regex.compile(pat_str).findall(doc)", "")


BUILDERS = dict(
    nbbpe=_nbbpe,
    nbbpe_list=lambda encoding, threads: _nbbpe(encoding, threads, numpy=False),
    nbbpe_regex=lambda encoding, threads: _nbbpe(encoding, threads, pretokenizer="regex"),
    tiktoken=_tiktoken, gigatoken=_gigatoken, fastokens=_fastokens, hf=_hf,
    bpe_openai=_bpe_openai, quicktok=_quicktok, findall=_findall,
)
