"""Download the CS336 datasets (TinyStories, the OpenWebText sample) where a network exists.

    python scripts/fetch_data.py                    # both, into data/
    python scripts/fetch_data.py tinystories --dest data
    python scripts/fetch_data.py owt --mirror http://127.0.0.1:8000   # same paths, another host

Files come from their public URLs (the ones the CS336 assignment gives); `.gz` files are
unpacked. Each file is written as `<name>.partial` and renamed when complete (its size checked
against the server's Content-Length), so an interrupted run leaves no file that looks complete
and a re-run starts that file over; files already present are skipped (`--force` fetches again).
`--mirror` replaces the scheme and host of every URL, keeping the path (the tests use a local
server this way; nothing here runs at test time against the internet).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request

from tqdm import tqdm

DATASETS = {
    "tinystories": [
        "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt",
        "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-valid.txt",
    ],
    "owt": [
        "https://huggingface.co/datasets/stanford-cs336/owt-sample/resolve/main/owt_train.txt.gz",
        "https://huggingface.co/datasets/stanford-cs336/owt-sample/resolve/main/owt_valid.txt.gz",
    ],
}
BLOCK = 1 << 20


class FetchError(Exception):
    """A download failed; the message names the URL and why."""


def mirrored(url: str, mirror: str | None) -> str:
    if not mirror:
        return url
    return mirror.rstrip("/") + urllib.parse.urlsplit(url).path


def download(url: str, path: str, *, timeout: float, progress: bool) -> None:
    """Fetch `url` into `path`, through `path.partial`, checking the size the server announced."""
    partial = path + ".partial"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
            length = response.headers.get("Content-Length")
            expected = int(length) if length is not None else None
            received = 0
            with tqdm(total=expected, unit="B", unit_scale=True, desc=os.path.basename(path),
                      disable=not progress) as bar:
                while block := response.read(BLOCK):
                    out.write(block)
                    received += len(block)
                    bar.update(len(block))
        if expected is not None and received != expected:
            raise FetchError(f"{url}: got {received:,} of {expected:,} bytes (connection cut?)")
    except urllib.error.HTTPError as exc:
        _remove(partial)
        raise FetchError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except http.client.HTTPException as exc:  # e.g. IncompleteRead: the connection was cut
        _remove(partial)
        raise FetchError(f"{url}: {type(exc).__name__} ({exc}); run again to start this file over") from None
    except (urllib.error.URLError, OSError) as exc:
        _remove(partial)
        reason = getattr(exc, "reason", exc)
        raise FetchError(f"{url}: {reason} (no network here? download it elsewhere and copy it "
                         f"to {path})") from None
    except BaseException:
        _remove(partial)
        raise
    os.replace(partial, path)


def gunzip(path: str, target: str) -> None:
    partial = target + ".partial"
    try:
        with gzip.open(path, "rb") as src, open(partial, "wb") as out:
            shutil.copyfileobj(src, out, BLOCK)
    except (OSError, EOFError) as exc:
        _remove(partial)
        raise FetchError(f"{path}: not a complete gzip file ({exc}); delete it and fetch again") from None
    except BaseException:
        _remove(partial)
        raise
    os.replace(partial, target)


def fetch(url: str, dest: str, *, force: bool, keep_gz: bool, timeout: float, progress: bool) -> str:
    """Download one file into `dest` (unpacking a .gz); return the final path."""
    name = os.path.basename(urllib.parse.urlsplit(url).path)
    target = os.path.join(dest, name[:-3] if name.endswith(".gz") else name)
    if os.path.exists(target) and not force:
        print(f"already there   {target}")
        return target
    if name.endswith(".gz"):
        packed = os.path.join(dest, name)
        if force or not os.path.exists(packed):
            download(url, packed, timeout=timeout, progress=progress)
        gunzip(packed, target)
        if not keep_gz:
            os.remove(packed)
    else:
        download(url, target, timeout=timeout, progress=progress)
    print(f"fetched         {target} ({os.path.getsize(target) / 1e6:.1f} MB)")
    return target


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("datasets", nargs="*", metavar="DATASET",
                        help=f"{' or '.join(DATASETS)} (default: all)")
    parser.add_argument("--dest", default="data", help="directory (default: %(default)s)")
    parser.add_argument("--mirror", help="scheme://host[:port] to fetch the same paths from")
    parser.add_argument("--force", action="store_true", help="fetch files already present again")
    parser.add_argument("--keep-gz", action="store_true", help="keep .gz files after unpacking")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds without data before giving up")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    for dataset in args.datasets:
        if dataset not in DATASETS:
            parser.error(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    os.makedirs(args.dest, exist_ok=True)
    progress = not args.quiet and sys.stderr.isatty()
    try:
        for dataset in args.datasets or list(DATASETS):
            for url in DATASETS[dataset]:
                fetch(mirrored(url, args.mirror), args.dest, force=args.force, keep_gz=args.keep_gz,
                      timeout=args.timeout, progress=progress)
    except FetchError as exc:
        print(f"fetch_data: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
