import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# The reference twins live beside the tests.
sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("nbbpe", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("nbbpe")


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def small_caches(monkeypatch):
    """Caches as small as a test asks for: a tokenizer's cache holds at least
    `encode_tables.MIN_CACHE_SIZE` pre-tokens (65,536), more than a test's text has, and the tests
    of a cache that grows and starts again use a few dozen. The floor's own test sets it back."""
    from nbbpe import encode_tables

    monkeypatch.setattr(encode_tables, "MIN_CACHE_SIZE", 1)


@pytest.fixture(autouse=True)
def small_batches_on_threads(monkeypatch):
    """A batch goes to a second thread from `tokenizer._SMALL_BATCH_CHARS` characters (384K), in
    groups of at least `_MIN_GROUP_CHARS` (128K): more text than most tests' batches have. So
    that their batches still run on threads, in several groups each, tests take the threads
    and groups of 64K and 1 character; the thresholds' own test sets them back."""
    from nbbpe import tokenizer

    monkeypatch.setattr(tokenizer, "_SMALL_BATCH_CHARS", 1 << 16)
    monkeypatch.setattr(tokenizer, "_MIN_GROUP_CHARS", 1)


@pytest.fixture(autouse=True)
def kernels_compiled(monkeypatch):
    """A first run on a small source learns its merges and encodes in Python while the merge
    loop's and the encode kernel are not in Numba's cache: what the cache holds changes as the
    suite runs, so every test sees them as cached, and the tests of that choice say otherwise."""
    from nbbpe import encode_python, merge_python

    monkeypatch.setattr(encode_python, "encode_kernel_compiled", lambda tokenizer: True)
    monkeypatch.setattr(merge_python, "merge_kernel_compiled", lambda: True)


@pytest.fixture(scope="session")
def gpt2_files():
    """GPT-2's (vocab, merges), from the fixture files."""
    from nbbpe.vocab_files import load_gpt2_files

    return load_gpt2_files(FIXTURES / "gpt2_vocab.json", FIXTURES / "gpt2_merges.txt")


@pytest.fixture(scope="session")
def gpt2(gpt2_files):
    """GPT-2's tokenizer with <|endoftext|> as a special token."""
    from nbbpe import Tokenizer

    return Tokenizer(*gpt2_files, ["<|endoftext|>"])
