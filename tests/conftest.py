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
