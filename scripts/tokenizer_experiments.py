"""CS336 assignment 1, tokenizer_experiments (§2.7): compression, cross-domain, throughput, encoding.

    python scripts/train_tinystories.py && python scripts/train_owt.py
    python scripts/tokenizer_experiments.py            # reads data/, writes out/tokens/

(a) compression ratio (bytes/token) of each tokenizer on `--docs` documents sampled from its own
    dataset; (b) the TinyStories tokenizer on the OpenWebText documents (and the reverse);
(c) throughput of `Tokenizer.encode` on one thread (bytes/s) on `--throughput-mb` of each
    dataset, and the time that implies for the Pile (825 GB), also at the parallel rate that
    `encode_file` reached in (d); (d) the train and valid files of each dataset encoded with its
    own tokenizer into flat uint16 token files (`np.memmap(path, dtype=np.uint16)`).

Documents are the texts between `<|endoftext|>` separators. Each sampled document is the one
after a random byte offset (seeded), so sampling reads only what it keeps, whatever the file
size; a document's chance is that of the document before it, close to uniform. Datasets or
tokenizers that are missing are reported and skipped; `sample` as a TinyStories path stands for
the sample shipped in nbbpe. Everything printed is also written to `<out>/experiments.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from nbbpe import Tokenizer, encode_file
from nbbpe.cli import EOT, PeakMemory, sample_corpus_path

PILE_BYTES = 825e9
WINDOW = 1 << 20


def sample_documents(path: str, n: int, seed: int, separator: str = EOT) -> list[tuple[int, str]]:
    """`n` distinct documents of the file as (byte offset, text stripped of surrounding
    whitespace); fewer if the file holds fewer non-empty documents."""
    sep = separator.encode("utf-8")
    size = os.path.getsize(path)
    rng = random.Random(seed)
    found: dict[int, str] = {}
    with open(path, "rb") as f:
        for _ in range(50 * n):
            if len(found) == n:
                break
            start = _start_of_document_after(f, rng.randrange(size), size, sep)
            end = _find(f, start, size, sep)
            f.seek(start)
            text = f.read(end - start).decode("utf-8", errors="replace").strip()
            if text:
                found[start] = text
    return sorted(found.items())


def _find(f, offset: int, size: int, sep: bytes) -> int:
    """Offset of the first separator at or after `offset`, or `size` if there is none."""
    pos = offset
    while pos < size:
        f.seek(pos)
        buf = f.read(WINDOW + len(sep))
        hit = buf.find(sep)
        if hit >= 0:
            return pos + hit
        pos += WINDOW
    return size


def _start_of_document_after(f, offset: int, size: int, sep: bytes) -> int:
    hit = _find(f, offset, size, sep)
    return 0 if hit + len(sep) >= size else hit + len(sep)  # past the last one: wrap to the first


def compression(tokenizer: Tokenizer, docs: list[tuple[int, str]]) -> dict:
    num_bytes = sum(len(text.encode("utf-8")) for _, text in docs)
    num_tokens = sum(len(tokenizer.encode_to_numpy(text)) for _, text in docs)
    return {"documents": len(docs), "bytes": num_bytes, "tokens": num_tokens,
            "bytes_per_token": num_bytes / num_tokens}


def throughput(tokenizer: Tokenizer, path: str, max_bytes: int) -> dict:
    """Encode up to `max_bytes` of the file (cut after a whole document) on this thread."""
    with open(path, "rb") as f:
        data = f.read(max_bytes)
    cut = data.rfind(EOT.encode())
    if 0 < cut and len(data) == max_bytes:
        data = data[: cut + len(EOT)]
    text = data.decode("utf-8", errors="replace")
    tokenizer.encode_to_numpy(text[:1000])  # compiled kernels loaded before the clock starts
    start = time.perf_counter()
    ids = tokenizer.encode_to_numpy(text)
    seconds = time.perf_counter() - start
    rate = len(data) / seconds
    return {"bytes": len(data), "tokens": len(ids), "seconds": seconds, "bytes_per_second": rate,
            "pile_hours": PILE_BYTES / rate / 3600}


def learned_tokens(tokenizer: Tokenizer) -> list[bytes]:
    """The tokens the merges made, in order of creation (not the bytes or special tokens)."""
    return [a + b for a, b in tokenizer.merges]


def longest_tokens(tokenizer: Tokenizer, n: int = 10) -> list[bytes]:
    """The `n` longest learned tokens, longest first (earlier merges first among equals)."""
    return sorted(learned_tokens(tokenizer), key=len, reverse=True)[:n]


def token_lengths(tokenizer: Tokenizer, docs: list[tuple[int, str]] | None = None) -> list[int]:
    """Byte lengths of the learned tokens in order of creation; given `docs`, of every token
    of their encoding instead (what the text is actually cut into)."""
    if docs is None:
        return [len(token) for token in learned_tokens(tokenizer)]
    length_by_id = {i: len(token) for i, token in tokenizer.vocab.items()}
    return [length_by_id[i] for _, text in docs for i in tokenizer.encode(text)]


def compression_by_vocab_size(tokenizer: Tokenizer, docs: list[tuple[int, str]],
                              vocab_sizes: list[int]) -> list[dict]:
    """Compression ratio on `docs` of the tokenizer cut down to each of `vocab_sizes`: the bytes,
    the special tokens and the first merges. Training is greedy, so that is the tokenizer that
    training with the smaller vocab size gives (and one training draws the whole curve)."""
    specials = tokenizer.special_tokens
    smallest = 256 + len(specials)
    rows = []
    for size in vocab_sizes:
        k = min(max(size - smallest, 0), len(tokenizer.merges))
        vocab = {i: bytes([i]) for i in range(256)}
        for a, b in tokenizer.merges[:k]:
            vocab[len(vocab)] = a + b  # the specials are appended after these: ids do not matter here
        cut = Tokenizer(vocab, tokenizer.merges[:k], specials, pattern=tokenizer.pattern)
        rows.append({"vocab_size": smallest + k, **compression(cut, docs)})
    return rows


def load(directory: str, what: str) -> Tokenizer | None:
    if os.path.exists(os.path.join(directory, "nbbpe.json")):
        return Tokenizer.load(directory)
    print(f"skipped: no {what} tokenizer in {directory} (run scripts/train_{what}.py)")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinystories-tokenizer", default=os.path.join("out", "tinystories_10k"))
    parser.add_argument("--owt-tokenizer", default=os.path.join("out", "owt_32k"))
    parser.add_argument("--tinystories-train", default=os.path.join("data", "TinyStoriesV2-GPT4-train.txt"))
    parser.add_argument("--tinystories-valid", default=os.path.join("data", "TinyStoriesV2-GPT4-valid.txt"))
    parser.add_argument("--owt-train", default=os.path.join("data", "owt_train.txt"))
    parser.add_argument("--owt-valid", default=os.path.join("data", "owt_valid.txt"))
    parser.add_argument("--docs", type=int, default=10, help="documents sampled per dataset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--throughput-mb", type=float, default=16.0,
                        help="MB of each dataset encoded on one thread for (c)")
    parser.add_argument("--workers", type=int, default=None, help="threads for (d) (default: one per CPU)")
    parser.add_argument("--skip-encode", action="store_true", help="leave out (d)")
    parser.add_argument("--out", default=os.path.join("out", "tokens"), help="directory for (d) and the report")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    def real(path: str) -> str:
        return sample_corpus_path() if path == "sample" else path

    datasets = {
        "tinystories": {"tokenizer": load(args.tinystories_tokenizer, "tinystories"),
                        "train": real(args.tinystories_train), "valid": real(args.tinystories_valid)},
        "owt": {"tokenizer": load(args.owt_tokenizer, "owt"),
                "train": real(args.owt_train), "valid": real(args.owt_valid)},
    }
    report: dict = {"docs": {}, "compression": {}, "throughput": {}, "encoded": {}}
    docs = {}
    for name, d in datasets.items():
        if os.path.exists(d["train"]):
            docs[name] = sample_documents(d["train"], args.docs, args.seed)
            report["docs"][name] = {"file": d["train"], "offsets": [o for o, _ in docs[name]]}
        else:
            print(f"skipped: {name} data not found at {d['train']} (scripts/fetch_data.py fetches it)")

    print("\n(a, b) compression ratio, bytes/token, on documents sampled from each dataset")
    for tok_name, d in datasets.items():
        for doc_name, sampled in docs.items():
            if d["tokenizer"] is None:
                continue
            result = compression(d["tokenizer"], sampled)
            report["compression"][f"{tok_name} tokenizer on {doc_name}"] = result
            print(f"  {tok_name:>11} tokenizer on {doc_name:>11} docs: {result['bytes_per_token']:.2f} "
                  f"({result['bytes']:,} bytes, {result['tokens']:,} tokens, {result['documents']} docs)")

    print("\n(c) throughput of Tokenizer.encode, one thread, and the time for the Pile (825 GB)")
    for name, d in datasets.items():
        if d["tokenizer"] is None or not os.path.exists(d["train"]):
            continue
        result = throughput(d["tokenizer"], d["train"], int(args.throughput_mb * 1e6))
        report["throughput"][name] = result
        print(f"  {name:>11}: {result['bytes_per_second'] / 1e6:.2f} MB/s on {result['bytes'] / 1e6:.1f} MB "
              f"-> {result['pile_hours']:.1f} hours ({result['pile_hours'] / 24:.1f} days) for 825 GB")

    if not args.skip_encode:
        print(f"\n(d) train and valid files to token files in {args.out} (uint16 where the vocab fits)")
        os.makedirs(args.out, exist_ok=True)
        for name, d in datasets.items():
            for split in ("train", "valid"):
                if d["tokenizer"] is None or not os.path.exists(d[split]):
                    continue
                out = os.path.join(args.out, f"{name}_{split}.bin")
                with PeakMemory() as memory:
                    result = encode_file(d["tokenizer"], d[split], out, num_workers=args.workers,
                                         progress=False if args.quiet else None)
                rate = result.source_bytes / result.seconds
                report["encoded"][f"{name}_{split}"] = {
                    "path": out, "tokens": result.num_tokens, "dtype": result.dtype,
                    "seconds": result.seconds, "bytes_per_second": rate,
                    "pile_hours": PILE_BYTES / rate / 3600, "peak_pss": memory.peak_pss}
                print(f"  {out}: {result.num_tokens:,} {result.dtype} tokens, {result.seconds:.1f} s, "
                      f"{rate / 1e6:.2f} MB/s ({PILE_BYTES / rate / 3600:.1f} hours for 825 GB at this "
                      f"rate), peak {memory.peak_pss / 1e6:.0f} MB PSS")
        print("  uint16 suits both tokenizers: their ids (10K, 32K) are below 65,536, and it halves "
              "the files, and the memory read in training, against int32.")

    os.makedirs(args.out, exist_ok=True)
    report_path = os.path.join(args.out, "experiments.json")
    with open(report_path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"\nreport: {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
