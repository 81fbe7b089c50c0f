"""nbbpe: exact, fast byte-level BPE training and encoding on Numba kernels."""

from .corpus import InvalidUTF8Error
from .pretokenize import CL100K_PATTERN, GPT2_PATTERN
from .token_files import encode_file, open_token_file
from .tokenizer import Tokenizer
from .train import train_bpe

__all__ = ["train_bpe", "Tokenizer", "encode_file", "open_token_file", "InvalidUTF8Error", "GPT2_PATTERN", "CL100K_PATTERN"]
