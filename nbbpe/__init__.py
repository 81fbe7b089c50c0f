"""nbbpe: exact, fast byte-level BPE training and encoding on Numba kernels.

Importing nbbpe imports neither Numba nor any kernel: each is loaded on first use.
"""

from .corpus import InvalidUTF8Error
from .patterns import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN
from .sources import SourceError
from .token_files import encode_file, open_token_file
from .tokenizer import Tokenizer
from .train import train_bpe, train_bpe_from_iterator

__all__ = ["train_bpe", "train_bpe_from_iterator", "Tokenizer", "encode_file", "open_token_file",
           "InvalidUTF8Error", "SourceError", "GPT2_PATTERN", "CL100K_PATTERN", "O200K_PATTERN"]
