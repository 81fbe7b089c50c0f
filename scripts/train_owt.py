"""CS336 assignment 1, train_bpe_expts_owt: a 32K-vocab byte-level BPE on OpenWebText.

    python scripts/fetch_data.py owt                  # data/owt_train.txt (11.9 GB)
    python scripts/train_owt.py                       # -> out/owt_32k/

Same report as scripts/train_tinystories.py (wall time, peak memory, longest token; the
tokenizer and `train_report.json` saved in the output directory).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tinystories import run  # noqa: E402  (the same script, other defaults)

DATASET = "OpenWebText"
CORPUS = os.path.join("data", "owt_train.txt")
VOCAB_SIZE = 32_000
OUT = os.path.join("out", "owt_32k")


def main(argv: list[str] | None = None) -> int:
    return run(argv, dataset=DATASET, corpus=CORPUS, vocab_size=VOCAB_SIZE, out=OUT)


if __name__ == "__main__":
    sys.exit(main())
