"""What the notebooks in notebooks/ share: where the corpora are, the machine they ran on, and
executing a notebook (for tests/test_notebooks.py, and to refresh the committed outputs).

    python scripts/notebook_support.py                      # both notebooks, small scale, in place
    python scripts/notebook_support.py notebooks/benchmarks.ipynb --scale medium

The notebooks read their settings from the environment, so a test or this script can change
them without editing a cell: NBBPE_NOTEBOOK_SCALE (tiny, small, medium, large), NBBPE_NOTEBOOK_DATA
("auto": the shared development corpora when present, else the small files in this repository;
"shared"; "repo"), NBBPE_NOTEBOOK_CORPUS (benchmarks: the text file the corpus sizes are made
from) and NBBPE_NOTEBOOK_RESULTS (where a notebook writes its numbers as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = ("benchmarks.ipynb", "tokenizer_experiments.ipynb")
KERNEL_NAME = "nbbpe-python"

# The shared development corpora (see their README): beside the checkout, as in CI, or at the
# place the development machines have them.
SHARED_CORPORA_DIRS = (os.path.join(os.path.dirname(ROOT), "shared", "corpora"), "/work/shared/corpora")
SHARED_FILES = dict(tinystories="tinystories_real.txt", web="web_5M.txt", multi="multi_1M.txt",
                    web_large="web_100M.txt")
REPO_FILES = dict(tinystories=os.path.join("nbbpe", "data", "tinystories_sample.txt"),
                  web=os.path.join("tests", "fixtures", "web_sample.txt"),
                  multi=os.path.join("tests", "fixtures", "multi_sample.txt"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def shared_corpora_dir() -> str | None:
    for directory in SHARED_CORPORA_DIRS:
        if all(os.path.exists(os.path.join(directory, name)) for name in SHARED_FILES.values()):
            return directory
    return None


def corpora(data: str = "auto") -> dict:
    """Paths of the corpora the notebooks use, by role: `tinystories`, `web` (English technical
    prose, the OpenWebText stand-in), `multi` (other languages and code), and `web_large` (100 MB,
    only with the shared corpora); `source` says which set it is."""
    if data not in ("auto", "shared", "repo"):
        raise ValueError(f"NBBPE_NOTEBOOK_DATA must be auto, shared or repo, not {data!r}")
    shared = shared_corpora_dir() if data != "repo" else None
    if data == "shared" and shared is None:
        raise FileNotFoundError(f"the shared corpora are in none of {SHARED_CORPORA_DIRS}")
    if shared:
        paths = {role: os.path.join(shared, name) for role, name in SHARED_FILES.items()}
        return dict(paths, source="shared development corpora")
    paths = {role: os.path.join(ROOT, name) for role, name in REPO_FILES.items()}
    return dict(paths, source="small samples shipped in this repository")


def describe_file(path: str) -> str:
    return f"{os.path.basename(path)} ({os.path.getsize(path) / 1e6:.2f} MB)"


def machine_summary() -> dict:
    """The machine, for the closing note: CPU model and count, memory, load, OS, versions."""
    import psutil

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {}
    for package in ("nbbpe", "numba", "numpy", "regex", "tiktoken", "tokenizers", "rustbpe", "gigatoken", "fastokens",
                    "bpe-openai", "quicktok-v1"):
        try:
            from importlib.metadata import version

            versions[package] = version(package)
        except Exception:  # not installed: the notebooks said so where it mattered
            versions[package] = None
    return {"cpu": model, "cpus": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "load_average_1min": round(os.getloadavg()[0], 2), "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "versions": versions}


def write_results(results: dict, path: str | None) -> None:
    """Write a notebook's numbers as JSON (atomically), if a path is set."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, ensure_ascii=False, default=str)
    os.replace(partial, path)


# --- executing a notebook ----------------------------------------------------------------------


def kernel_manager(directory: str):
    """A manager for an IPython kernel that runs this very interpreter (sys.executable), so the
    notebook sees the same packages as the caller, whatever kernel specs are installed elsewhere.
    The kernel spec is written into `directory`."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec_dir = os.path.join(directory, "kernels", KERNEL_NAME)
    os.makedirs(spec_dir, exist_ok=True)
    with open(os.path.join(spec_dir, "kernel.json"), "w", encoding="utf-8") as f:
        json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": "Python 3 (ipykernel)", "language": "python"}, f)
    specs = KernelSpecManager(kernel_dirs=[os.path.join(directory, "kernels")])
    # The connection file there too: the user's Jupyter runtime directory may not be writable.
    return AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs,
                              connection_file=os.path.join(directory, "connection.json"))


def execute_notebook(path: str, settings: dict[str, str], timeout: float = 900):
    """Run the notebook at `path` top to bottom in a fresh kernel with the NBBPE_NOTEBOOK_*
    `settings` in its environment, from the notebook's directory; return the executed notebook
    (not written anywhere). A cell that raises stops it with nbclient's CellExecutionError."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="nbbpe-kernel-") as directory:
        # Inline figures even where MPLBACKEND says otherwise; no user IPython profile.
        env = dict(os.environ, **settings, MPLBACKEND="module://matplotlib_inline.backend_inline",
                   IPYTHONDIR=os.path.join(directory, "ipython"))
        client = NotebookClient(notebook, km=kernel_manager(directory), timeout=timeout,
                                record_timing=False, allow_errors=False,
                                resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}})
        client.execute(env=env)
    # The committed notebooks name the usual kernel, whatever ran them here.
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                       "language": "python"}
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="default: both notebooks in notebooks/")
    parser.add_argument("--scale", default="small", help="tiny, small, medium or large")
    parser.add_argument("--data", default="auto", help="auto, shared or repo")
    parser.add_argument("--corpus", help="benchmarks: the text file the corpus sizes are made from")
    parser.add_argument("--results-dir", default=os.path.join(ROOT, "out", "notebooks"),
                        help="where each notebook writes its numbers as JSON")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per cell")
    args = parser.parse_args(argv)
    import nbformat

    paths = args.notebooks or [os.path.join(ROOT, "notebooks", name) for name in NOTEBOOKS]
    for path in paths:
        stem = os.path.splitext(os.path.basename(path))[0]
        settings = {"NBBPE_NOTEBOOK_SCALE": args.scale, "NBBPE_NOTEBOOK_DATA": args.data,
                    "NBBPE_NOTEBOOK_RESULTS": os.path.join(args.results_dir, f"{stem}_{args.scale}.json")}
        if args.corpus:
            settings["NBBPE_NOTEBOOK_CORPUS"] = os.path.abspath(args.corpus)
        start = time.perf_counter()
        executed = execute_notebook(path, settings, timeout=args.timeout)
        nbformat.write(executed, path)
        print(f"{path}: executed in {time.perf_counter() - start:.0f} s, outputs written; "
              f"numbers in {settings['NBBPE_NOTEBOOK_RESULTS']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
