"""The notebooks run top to bottom on their smallest setting, so they cannot rot.

Each is executed with nbclient in a kernel of this very interpreter, at the `tiny` scale on the
samples shipped in the repository (as in a fresh clone without the shared corpora); the numbers
it writes as JSON are then checked. Peers that are not installed (rustbpe and gigatoken are in
the `bench` extra, not `test`) must be left out and named as such, never fail the run.
"""

import json
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench_encode  # noqa: E402
import bench_train  # noqa: E402
import notebook_support  # noqa: E402

TRAIN_TOOLS = {"nbbpe", "rustbpe", "hf", "gigatoken", "python"}


def execute(name, tmp_path):
    """Run the notebook on its smallest setting; its numbers, and its code cells' outputs."""
    results = tmp_path / f"{name}.json"
    notebook = notebook_support.execute_notebook(
        str(ROOT / "notebooks" / f"{name}.ipynb"),
        {"NBBPE_NOTEBOOK_SCALE": "tiny", "NBBPE_NOTEBOOK_DATA": "repo", "NBBPE_NOTEBOOK_RESULTS": str(results)},
        timeout=600,
    )
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert [o for o in outputs if o.output_type == "error"] == []
    return json.loads(results.read_text(encoding="utf-8")), outputs


def figures(outputs):
    return sum("image/png" in o.get("data", {}) for o in outputs)


def test_benchmarks_notebook_runs_and_measures_every_installed_tool(tmp_path):
    results, outputs = execute("benchmarks", tmp_path)
    assert figures(outputs) == 4  # training, training per pattern, encoding, nbbpe's phases
    assert results["python"] == sys.executable  # the kernel saw this interpreter's packages
    assert results["data"] == "small samples shipped in this repository"
    assert results["corpus_en_equals_reference"] == {"nbbpe": True, "python": True}

    rows = results["train"]
    assert [r for r in rows if "error" in r] == []
    measured = {r["tool"] for r in rows}
    missing = set(results["train_tools_missing"])
    assert measured | missing == TRAIN_TOOLS and not measured & missing
    assert {"nbbpe", "hf", "python"} <= measured  # the test extra has these
    assert all(not bench_train.tool_available(tool) for tool in missing)
    text = "".join(o.get("text", "") for o in outputs)
    for tool in missing:
        assert f"left out: {tool} " in text
    sizes = results["config"]["train_mb"]
    nbbpe_rows = [r for r in rows if r["tool"] == "nbbpe"]
    assert len(nbbpe_rows) == len(sizes)
    assert all(r["vocab"] == results["config"]["vocab_size"] for r in nbbpe_rows)
    assert all(r["peak_rss_mb"] > 0 and r["process_s"] >= r["train_s"] > 0 for r in rows)
    assert all(set(r["phases"]) >= {"pretokenize", "intern", "merge", "total"} for r in nbbpe_rows)
    assert len(results["nbbpe_seconds"]) == len(sizes)

    by_pattern = results["train_patterns"]
    assert [r for r in by_pattern["rows"] if "error" in r] == []
    assert {(r["tool"], r["pattern"]) for r in by_pattern["rows"]} == {
        (tool, pattern) for tool in by_pattern["tools"] for pattern in bench_train.PATTERNS}
    assert set(by_pattern["nbbpe_ratio_to_gpt2"]) == {"cl100k", "o200k"}
    assert all(ratio > 0 for ratio in by_pattern["nbbpe_ratio_to_gpt2"].values())

    encoding = results["encoding"]  # GPT-2's; the tiny scale measures no other
    assert encoding["encoding"] == "gpt2" and set(results["encodings"]) == {"gpt2"}
    encoded = set(encoding["single"])
    assert encoded | set(results["encode_tools_missing"]) == set(bench_encode.TOOLS)
    assert {"nbbpe", "nbbpe_regex", "tiktoken", "hf"} <= encoded
    assert set(encoding["pool"]) == encoded and encoding["documents"] > 0
    for way in ("single", "pool"):
        assert all(r["ids_equal"] and r["mb_s"] > 0 for r in encoding[way].values())


def test_tokenizer_experiments_notebook_answers_the_questions(tmp_path):
    results, outputs = execute("tokenizer_experiments", tmp_path)
    assert figures(outputs) == 3  # compression matrix, vocabulary growth, token lengths
    assert results["python"] == sys.executable
    corpora = ["tinystories", "web", "multi"]

    for name in corpora:
        training = results["training"][name]
        assert training["vocab_size"] == results["config"]["vocab_sizes"][name]  # the samples are big enough
        assert training["longest_token_bytes"] == len(results["longest_tokens"][name][0].encode())
        lengths = [len(t.encode()) for t in results["longest_tokens"][name]]
        assert lengths == sorted(lengths, reverse=True)

    # Every tokenizer compresses best the corpus it was trained on.
    compression = results["compression"]
    for docs in corpora:
        column = {tok: compression[tok][docs] for tok in corpora}
        assert max(column, key=column.get) == docs and min(column.values()) > 1

    # One more merge never adds a token (it is applied last, where its pair remains), so the
    # ratio never falls as the vocabulary grows; the full vocabulary gives the matrix's ratio.
    for name in corpora:
        curve = results["growth"][f"{name} on {name}"]
        ratios = [r for _, r in curve]
        assert ratios == sorted(ratios) and ratios[0] == 1.0
        assert abs(ratios[-1] - compression[name][name]) < 1e-12

    for name in corpora:
        assert results["throughput"][name]["bytes_per_second"] > 0
        token_file = results["token_files"][name]
        assert token_file["dtype"] == "uint16" and token_file["beginning_equal"]
        assert token_file["file_bytes"] == 2 * token_file["tokens"]


FIGURES = {"benchmarks.ipynb": 4, "tokenizer_experiments.ipynb": 3}


def test_committed_notebooks_carry_their_outputs():
    """The notebooks in the repository are committed executed (plots included), without errors."""
    for name in notebook_support.NOTEBOOKS:
        notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
        assert [o for o in outputs if o.output_type == "error"] == [], name
        assert figures(outputs) == FIGURES[name], name
        assert all(cell.execution_count for cell in notebook.cells if cell.cell_type == "code"), name
