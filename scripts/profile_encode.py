"""Where the encode pass spends its CPU time, by compiled function and by instruction (Linux perf).

    python scripts/profile_encode.py [CORPUS] [--pattern gpt2|cl100k|o200k] [--pass warm|cold]
        [--seconds 8] [--frequency 4000] [--top 15] [--instructions NAME] [--json out.json]

encode_breakdown.py times the pass by stages (scan, lookups, merging); this samples it: a child
process, with a fresh Numba cache so that every kernel is compiled in it (the machine code of a
kernel loaded from the cache comes without its symbols), encodes CORPUS (default: web_5M.txt; its
documents as one `encode_utf8` call) again and again for `--seconds` while `perf record -e
cpu-clock` samples it. Numba's machine code is named for perf through a map of every compiled
function's symbols (/tmp/perf-PID.map), so each sample lands on a function:
`encode_gpt2_merges` (the pass: scanning, looking up, writing ids, with what is inlined into it),
`_merge_rounds` (the merge loop, for new pre-tokens), `store`, ..., libc, Python, NumPy.

- `--pass warm`: the cache knows every pre-token after the first pass: lookups only.
- `--pass cold`: before each pass the cache starts again from the vocab table and the thread's part
  cache is emptied, as in a fresh tokenizer (copying the vocab table back shows as libc's memmove).
- `--instructions NAME`: the hottest instructions of function NAME (e.g. `_merge_rounds`), with
  their share of all samples. A sample lands on the instruction after the one that waited, mostly:
  a load that missed the CPU's caches shows as heat on the instruction that follows it.

cpu-clock sampling is a timer, so it works where hardware counters do not (a VM); perf itself
slows the process down (at 4000 Hz, by a few per cent). Needs `perf`, `nm` and `objdump` on PATH.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
NEEDED = ("perf", "nm", "objdump")


class Region(NamedTuple):
    """Machine code of one compiled function: [start, start + size), and its readable name."""

    start: int
    size: int
    name: str


def readable(symbol: str) -> str:
    """The function a Numba symbol names: `_ZN5nbbpe6encode13_merge_roundsB3v55B...` ->
    `nbbpe.encode._merge_rounds`; Numba's CPython and cfunc wrappers are marked as such."""
    wrapper = ""
    if symbol.startswith("cfunc."):
        symbol, wrapper = symbol[len("cfunc."):], " (cfunc wrapper)"
    if not symbol.startswith("_ZN"):
        return symbol + wrapper
    parts = []
    at = 3
    while at < len(symbol) and symbol[at].isdigit():
        digits = re.match(r"\d+", symbol[at:]).group()
        at += len(digits)
        parts.append(symbol[at : at + int(digits)])
        at += int(digits)
    if parts and parts[0] == "cpython":
        parts, wrapper = parts[1:], " (Python wrapper)"
    return ".".join(parts) + wrapper


def regions_of(dispatcher) -> list[Region]:
    """The functions in the machine code of each compilation of a Numba `dispatcher` (its own,
    and those of the functions compiled into it), at the addresses they were loaded at. Empty
    for code loaded from Numba's cache, whose object file is not kept."""
    regions = []
    for compiled in dispatcher.overloads.values():
        library = compiled.library
        try:
            obj = library._get_compiled_object()  # Numba's internals: may be absent or change
        except Exception:
            continue
        with tempfile.NamedTemporaryFile(suffix=".o") as f:
            f.write(obj)
            f.flush()
            listing = subprocess.run(["nm", "-S", "--defined-only", f.name], capture_output=True,
                                     text=True, check=True).stdout
        symbols = {}
        for line in listing.splitlines():
            fields = line.split()
            if len(fields) == 4 and fields[2] in "tT":
                symbols[fields[3]] = (int(fields[0], 16), int(fields[1], 16))
        anchor = compiled.fndesc.llvm_func_name
        if anchor not in symbols:
            continue
        base = library.get_pointer_to_function(anchor) - symbols[anchor][0]
        regions += [Region(base + offset, size, readable(symbol))
                    for symbol, (offset, size) in symbols.items() if size]
    return regions


def compiled_regions() -> list[Region]:
    """`regions_of` every compiled function of the nbbpe modules loaded, by address."""
    from numba.core.registry import CPUDispatcher

    seen = {}
    for name, module in list(sys.modules.items()):
        if name == "nbbpe" or name.startswith("nbbpe."):
            for value in list(vars(module).values()):
                if isinstance(value, CPUDispatcher):
                    for region in regions_of(value):
                        seen[region.start] = region
    return sorted(seen.values())


def find_region(regions: list[Region], ip: int) -> Region | None:
    """The region holding address `ip` (regions sorted by start), or None."""
    lo, hi = 0, len(regions)
    while lo < hi:
        mid = (lo + hi) // 2
        if regions[mid].start <= ip:
            lo = mid + 1
        else:
            hi = mid
    if lo and ip < regions[lo - 1].start + regions[lo - 1].size:
        return regions[lo - 1]
    return None


def attribute(samples, regions: list[Region]) -> tuple[collections.Counter, collections.Counter]:
    """(samples by function, samples by address within nbbpe's code) of `samples`, pairs of
    (instruction address, what perf named it: `symbol (dso)`)."""
    by_function: collections.Counter = collections.Counter()
    by_address: collections.Counter = collections.Counter()
    for ip, where in samples:
        region = find_region(regions, ip)
        if region is not None:
            by_function[region.name] += 1
            by_address[ip] += 1
        else:
            by_function[where] += 1
    return by_function, by_address


def perf_samples(data_file: str) -> list[tuple[int, str]]:
    """(address, `symbol (dso)`) of each sample in a perf.data file."""
    listing = subprocess.run(["perf", "script", "-i", data_file, "-F", "ip,sym,dso"],
                             capture_output=True, text=True, check=True).stdout
    samples = []
    for line in listing.splitlines():
        match = re.match(r"\s*([0-9a-f]+)\s+(.*?)\s*\((.*)\)\s*$", line)
        if match:
            ip, symbol, dso = match.groups()
            symbol = re.sub(r"\+0x[0-9a-f]+$", "", symbol)
            samples.append((int(ip, 16), f"{symbol} ({os.path.basename(dso)})"))
    return samples


def hot_instructions(region: Region, code: bytes, by_address: collections.Counter, total: int,
                     top: int, context: int = 3) -> list[str]:
    """Lines of `region`'s disassembly around its `top` hottest instructions, each prefixed
    with its share of all samples."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(code)
        f.flush()
        listing = subprocess.run(["objdump", "-D", "-b", "binary", "-mi386:x86-64",
                                  f"--adjust-vma={region.start:#x}", f.name],
                                 capture_output=True, text=True, check=True).stdout
    lines = []
    for line in listing.splitlines():
        match = re.match(r"\s*([0-9a-f]+):\s+(?:[0-9a-f]{2} )+\s*(.*)$", line)
        if match and match.group(2).strip():  # (not the rest of a long instruction's bytes)
            lines.append((int(match.group(1), 16), match.group(2).strip()))
    hottest = sorted(range(len(lines)), key=lambda k: -by_address[lines[k][0]])[:top]
    shown = sorted({j for k in hottest for j in range(max(0, k - context),
                                                      min(len(lines), k + 2))})
    out = []
    for previous, k in zip([None] + shown, shown):
        if previous is not None and k != previous + 1:
            out.append("        ...")
        ip, text = lines[k]
        out.append(f"{100 * by_address[ip] / total:6.2f}% {ip - region.start:6x}  {text}")
    return out


def profile(args) -> dict:
    """The child process's work (a fresh Numba cache): encode, sample, attribute."""
    sys.path.insert(0, HERE)
    import numpy as np

    from bench_encode import default_corpora, documents
    from encode_breakdown import tokenizer
    from nbbpe import encode

    tok = tokenizer(args.pattern)
    # Compile the family's kernel here (a first run would compile it in another process).
    mode = encode.MERGES if args.pattern == "gpt2" else encode.RANKS
    encode.ENCODERS[args.pattern][mode].compile(encode.KERNEL_SIGNATURE.args)
    corpus = args.corpus or default_corpora()[0]
    docs = list(documents(corpus))
    buf = np.frombuffer(b"".join(docs), dtype=np.uint8)
    ends = np.cumsum([len(d) for d in docs], dtype=np.int64)
    tok.encode_utf8(buf, ends)  # every kernel the pass uses is compiled now
    engine = tok._get_engine()
    state = tok._thread_state()
    parts = slice(5 * encode.WINDOW, 5 * encode.WINDOW + encode.PART_CACHE_ITEMS)

    regions = compiled_regions()
    map_file = f"/tmp/perf-{os.getpid()}.map"
    with open(map_file, "w") as f:
        for region in regions:
            f.write(f"{region.start:x} {region.size:x} {region.name}\n")
    data_file = os.path.join(args.work_dir, "perf.data")
    recorder = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F",
                                 str(args.frequency), "-p", str(os.getpid()), "-o", data_file],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # perf attaches
        passes = 0
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            if args.pass_ == "cold":  # as a fresh tokenizer: the vocab table, no parts
                engine.cache.table = engine.cache._fresh()
                state.scratch[parts] = 0
            tok.encode_utf8(buf, ends)
            passes += 1
        elapsed = time.perf_counter() - start
    finally:
        recorder.send_signal(2)
        recorder.wait()
    try:
        samples = perf_samples(data_file)
    finally:
        os.unlink(map_file)
    by_function, by_address = attribute(samples, regions)
    total = max(1, sum(by_function.values()))
    result = {"corpus": corpus, "pattern": args.pattern, "pass": args.pass_, "passes": passes,
              "seconds": elapsed, "samples": total,
              "functions": [{"name": name, "share": count / total}
                            for name, count in by_function.most_common()]}
    if args.instructions:
        named = [r for r in regions if r.name.split(".")[-1] == args.instructions
                 or r.name == args.instructions]
        hottest = max(named, key=lambda r: sum(c for ip, c in by_address.items()
                                               if r.start <= ip < r.start + r.size),
                      default=None)
        if hottest is None:
            raise SystemExit(f"no compiled function named {args.instructions!r}")
        code = ctypes.string_at(hottest.start, hottest.size)
        result["instructions"] = {"function": hottest.name, "lines": hot_instructions(
            hottest, code, by_address, total, args.top)}
    return result


def report(result: dict, top: int) -> None:
    print(f"{result['pattern']}, {os.path.basename(result['corpus'])}, {result['pass']} passes: "
          f"{result['passes']} in {result['seconds']:.1f} s "
          f"({1e3 * result['seconds'] / max(1, result['passes']):.1f} ms each, under perf); "
          f"{result['samples']:,} samples")
    for row in result["functions"][:top]:
        print(f"  {100 * row['share']:5.1f}%  {row['name']}")
    if "instructions" in result:
        print(f"\nhottest instructions of {result['instructions']['function']} "
              "(share of all samples, offset, instruction):")
        print("\n".join(result["instructions"]["lines"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", default=None)
    parser.add_argument("--pattern", default="gpt2", choices=["gpt2", "cl100k", "o200k"])
    parser.add_argument("--pass", dest="pass_", default="warm", choices=["warm", "cold"])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--frequency", type=int, default=4000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--instructions", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--in-fresh-cache", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.in_fresh_cache:  # the child: profile, hand the result back on stdout
        print(json.dumps(profile(args)))
        return 0
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        print(f"profile_encode: needs {', '.join(missing)} on PATH (Linux perf and binutils)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as work:  # the child's Numba cache and perf.data
        child = subprocess.run([sys.executable, os.path.abspath(__file__), *(argv or sys.argv[1:]),
                                "--in-fresh-cache", "--work-dir", work],
                               env={**os.environ, "NUMBA_CACHE_DIR": os.path.join(work, "numba")},
                               capture_output=True, text=True)
    if child.returncode != 0:
        print(child.stderr, file=sys.stderr)
        return child.returncode
    result = json.loads(child.stdout.strip().splitlines()[-1])
    report(result, args.top)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
