"""Sources: every container yields exactly the documents written, in order, however cut."""

import bz2
import gzip
import json
import lzma
import pickle
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe.corpus import InvalidUTF8Error, chunk_boundaries
from nbbpe.sources import (
    SourceError,
    encode_document,
    iter_text_batches,
    plan_units,
    read_unit,
    resolve_source,
)

EOT = "<|endoftext|>"
COMPRESS = {
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
}
# Pieces that stress documents and cuts: newlines, quotes, escapes, non-ASCII, special-token text.
PIECES = [
    "a",
    "Z9",
    " ",
    "  ",
    "\n",
    "\r\n",
    "\t",
    '"',
    "\\",
    "'s",
    ".",
    "é",
    "中",
    "🙂",
    "\u2028",
    "\x00",
    EOT,
    "<|end",
    "oftext|>",
    "word ",
    "{}",
    "[1]",
]
documents_st = st.lists(st.lists(st.sampled_from(PIECES), max_size=30).map("".join), max_size=12)


def batches_of(source, chunk_bytes=1 << 20, special_tokens=(), errors="strict", **names):
    """All batches of a source, its units pickled on the way as if sent to other processes."""
    units = plan_units(
        resolve_source(source, **names), chunk_bytes=chunk_bytes, special_tokens=special_tokens
    )
    units = pickle.loads(pickle.dumps(units))
    return [batch for unit in units for batch in read_unit(unit, errors=errors)]


def check_batch(batch):
    assert batch.data.dtype == np.uint8 and batch.data.ndim == 1 and batch.data.flags.c_contiguous
    assert not batch.data.flags.writeable  # always read-only: compiled kernels see one array type
    assert batch.doc_ends.dtype == np.int64 and len(batch.doc_ends) >= 1
    assert np.all(np.diff(batch.doc_ends) >= 0) and batch.doc_ends[0] >= 0
    assert batch.doc_ends[-1] == len(batch.data)


def documents_of(batches):
    """The documents of batches, as bytes; a text batch is one piece of a document."""
    docs = []
    for batch in batches:
        check_batch(batch)
        assert batch.documents
        starts = [0, *batch.doc_ends[:-1]]
        docs += [batch.data[a:b].tobytes() for a, b in zip(starts, batch.doc_ends)]
    return docs


def text_of(batches):
    for batch in batches:
        check_batch(batch)
        assert not batch.documents and list(batch.doc_ends) == [len(batch.data)]
    return b"".join(batch.data.tobytes() for batch in batches)


def cuts_of(batches):
    sizes = [len(batch.data) for batch in batches]
    return [0, *np.cumsum(sizes).tolist()]


def write(path, data: bytes):
    """Write `data` to `path`, compressed as its last suffix says."""
    compress = COMPRESS.get(path.suffix, lambda d: d)
    path.write_bytes(compress(data))
    return path


def jsonl(docs, field="text", blank_every=0, ensure_ascii=False) -> bytes:
    lines = []
    for i, doc in enumerate(docs):
        if blank_every and i % blank_every == 0:
            lines.append(" \t")
        lines.append(json.dumps({"id": i, field: doc}, ensure_ascii=ensure_ascii))
    return ("\n".join(lines) + "\n").encode()


def parquet(path, docs, row_group_size=3, kind=pa.string()):
    pq.write_table(
        pa.table({"id": list(range(len(docs))), "text": pa.array(docs, kind)}),
        path,
        row_group_size=row_group_size,
    )
    return path


TEXT = ("Once upon a time there was a word.\n" + EOT + "\nNo specials here at all but words ") * 40


# ---------------------------------------------------------------------------------------------
# Text


@pytest.mark.parametrize("suffix", ["", ".gz", ".bz2", ".xz", ".zst"])
@pytest.mark.parametrize("chunk_bytes", [7, 64, 1000, 1 << 20])
def test_text_is_passed_through_and_cut_as_chunk_boundaries_cuts(tmp_path, suffix, chunk_bytes):
    plain = write(tmp_path / "plain.txt", TEXT.encode())
    path = write(tmp_path / f"corpus.txt{suffix}", TEXT.encode())
    batches = batches_of(path, chunk_bytes, [EOT])
    assert text_of(batches) == TEXT.encode()
    assert cuts_of(batches) == chunk_boundaries(plain, chunk_bytes, [EOT])


def test_compressed_text_cuts_match_across_the_read_window(tmp_path):
    # Stretches without a safe place longer than the 64 KiB window make the cutter read on.
    text = ("word " * 3000 + "-" * 150_000 + " " + EOT + "x" * 70_000 + " tail ") * 3
    plain = write(tmp_path / "plain.txt", text.encode())
    for chunk_bytes in (5000, 100_000):
        for specials in ([], [EOT]):
            batches = batches_of(
                write(tmp_path / "c.txt.zst", text.encode()), chunk_bytes, specials
            )
            assert text_of(batches) == text.encode()
            assert cuts_of(batches) == chunk_boundaries(plain, chunk_bytes, specials)


@settings(max_examples=60)
@given(
    parts=st.lists(st.sampled_from(PIECES), min_size=1, max_size=150),
    chunk_bytes=st.integers(1, 40),
    specials=st.sampled_from([[], [EOT], [EOT, "<|end"]]),
)
def test_text_cuts_do_not_depend_on_compression(tmp_path_factory, parts, chunk_bytes, specials):
    data = "".join(parts).encode()
    tmp = tmp_path_factory.mktemp("t")
    expected = chunk_boundaries(write(tmp / "a.txt", data), chunk_bytes, specials)
    for name in ("a.txt", "a.txt.gz"):
        batches = batches_of(write(tmp / name, data), chunk_bytes, specials)
        assert text_of(batches) == data and cuts_of(batches) == expected


def test_text_place_names_the_byte(tmp_path):
    path = write(tmp_path / "t.txt", TEXT.encode())
    batches = batches_of(path, 100, [EOT])
    start = len(batches[0].data) + len(batches[1].data)
    assert batches[2].place(5) == f"{tmp_path / 't.txt'} byte {start + 5}"
    gz = batches_of(write(tmp_path / "t.txt.gz", TEXT.encode()), 100, [EOT])
    assert gz[2].place(5) == f"{tmp_path / 't.txt.gz'} (decompressed) byte {start + 5}"


def test_text_bytes_are_not_validated(tmp_path):
    data = b"ok \xff\xfe bad utf-8\n"
    assert text_of(batches_of(write(tmp_path / "bad.txt", data))) == data


# ---------------------------------------------------------------------------------------------
# JSONL


@settings(max_examples=60)
@given(
    docs=documents_st,
    chunk_bytes=st.sampled_from([1, 7, 64, 1 << 20]),
    ascii_only=st.booleans(),
    suffix=st.sampled_from([".jsonl", ".jsonl.gz", ".json", ".ndjson.zst"]),
)
def test_jsonl_documents_whatever_the_chunking(
    tmp_path_factory, docs, chunk_bytes, ascii_only, suffix
):
    path = write(
        tmp_path_factory.mktemp("j") / f"d{suffix}",
        jsonl(docs, blank_every=3, ensure_ascii=ascii_only),
    )
    assert documents_of(batches_of(path, chunk_bytes)) == [d.encode() for d in docs]
    # Batches smaller than the units give the same documents.
    units = plan_units(resolve_source(path), chunk_bytes=chunk_bytes)
    assert documents_of(b for u in units for b in read_unit(u, chunk_bytes=5)) == [
        d.encode() for d in docs
    ]


def test_jsonl_field_crlf_bom_and_last_line_without_newline(tmp_path):
    data = '\ufeff{"body": "one"}\r\n\r\n{"body": "two\\nlines", "text": 1}\n{"body": ""}'.encode()
    path = write(tmp_path / "d.jsonl", data)
    assert documents_of(batches_of(path, text_field="body")) == [b"one", b"two\nlines", b""]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_jsonl_place_names_the_line(tmp_path, suffix):
    docs = [f"document {i}" for i in range(40)]
    path = write(tmp_path / f"d{suffix}", jsonl(docs, blank_every=4))
    batches = batches_of(path, 64)
    assert len(batches) > 5
    line = {doc: n for n, doc in enumerate(jsonl(docs, blank_every=4).decode().splitlines(), 1)}
    for batch in batches:
        for d, end in enumerate(batch.doc_ends):
            text = batch.data[(batch.doc_ends[d - 1] if d else 0) : end].tobytes().decode()
            n = line[json.dumps({"id": docs.index(text), "text": text})]
            assert batch.place(int(end) - 1) == f"{path} line {n}, text byte {len(text) - 1}"


JSONL_ERRORS = [
    ('{"text": "a"', r"line 3: not valid JSON"),
    ('["text"]', r"line 3: expected a JSON object with a 'text' field, got an array"),
    ('"text"', r"line 3: expected a JSON object .* got a string"),
    ('{"body": "x"}', r"line 3: no 'text' field \(fields: 'body'\); choose one with text_field="),
    ('{"text": 12}', r"line 3: the 'text' field is a number, not a string"),
    ('{"text": null}', r"line 3: the 'text' field is null, not a string"),
    ('{"text": ["a"]}', r"line 3: the 'text' field is an array"),
]


@pytest.mark.parametrize("bad, message", JSONL_ERRORS)
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.xz"])
def test_jsonl_errors_name_file_and_line(tmp_path, bad, message, suffix):
    data = f'{{"text": "ok"}}\n\n{bad}\n{{"text": "ok"}}\n'.encode()
    path = write(tmp_path / f"d{suffix}", data)
    with pytest.raises(SourceError, match=re.escape(str(path)) + " " + message):
        batches_of(path)


def test_jsonl_error_line_in_a_unit_that_starts_mid_file(tmp_path):
    lines = [json.dumps({"text": f"document number {i}"}) for i in range(500)]
    lines[377] = '{"text": 5}'
    path = write(tmp_path / "d.jsonl", ("\n".join(lines) + "\n").encode())
    units = plan_units(resolve_source(path), chunk_bytes=1000)
    assert len(units) > 10 and units[-1].start > 0
    with pytest.raises(SourceError, match=r"d\.jsonl line 378: the 'text' field is a number"):
        for unit in reversed(units):  # any order: each unit knows its place
            list(read_unit(unit))


def test_json_hint_for_a_json_array_file(tmp_path):
    path = write(tmp_path / "d.json", b'[\n  {"text": "a"}\n]\n')
    with pytest.raises(SourceError, match=r"line 1: not valid JSON.*read as JSON Lines"):
        batches_of(path)


def test_jsonl_invalid_utf8_policy(tmp_path):
    path = write(tmp_path / "d.jsonl", b'{"text": "a"}\n{"text": "b\xff c"}\n')
    with pytest.raises(
        InvalidUTF8Error, match=r"d\.jsonl line 2: invalid UTF-8 at byte offset 25 of the file"
    ) as info:
        batches_of(path)
    assert info.value.offset == 25
    assert documents_of(batches_of(path, errors="replace")) == [b"a", "b\ufffd c".encode()]


def test_jsonl_lone_surrogate_policy(tmp_path):
    path = write(
        tmp_path / "d.jsonl.gz", b'{"text": "ok"}\n{"text": "x\\ud800y \\ud83d\\ude00 \\udc00"}\n'
    )
    with pytest.raises(
        InvalidUTF8Error, match=r"d\.jsonl\.gz line 2: lone surrogate U\+D800 at character 1"
    ):
        batches_of(path)
    assert documents_of(batches_of(path, errors="replace")) == [
        b"ok",
        "x\ufffdy \U0001f600 \ufffd".encode(),
    ]


# ---------------------------------------------------------------------------------------------
# Parquet


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.string_view()])
@pytest.mark.parametrize("chunk_bytes", [1, 20, 1 << 20])
def test_parquet_row_groups_and_string_types(tmp_path, kind, chunk_bytes):
    docs = ["", "héllo", EOT, "line\nbreak", "🙂" * 10, "x" * 100, "", "last"]
    path = parquet(tmp_path / "d.parquet", docs, row_group_size=3, kind=kind)
    units = plan_units(resolve_source(path), chunk_bytes=chunk_bytes)
    assert [u.row_group for u in units] == [0, 1, 2] and [u.first_row for u in units] == [0, 3, 6]
    batches = batches_of(path, chunk_bytes)
    assert documents_of(batches) == [d.encode() for d in docs]
    last = batches[-1]
    assert last.place(len(last.data) - 1) == f"{path} row 8, text byte 3"


def test_parquet_dictionary_column_and_other_column_name(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": pa.array(["a", "b", "a"]).dictionary_encode()}), path)
    assert documents_of(batches_of(path, text_column="body")) == [b"a", b"b", b"a"]


def test_arrow_sliced_and_chunked_arrays():
    from nbbpe.sources import SourceFile, _arrow_strings_batches

    file = SourceFile("x.parquet", "parquet", None, 1)
    for kind in (pa.string(), pa.large_string()):
        array = pa.array([f"doc {i}" for i in range(10)], kind).slice(3, 4)
        chunked = pa.chunked_array([array, pa.array([], kind), array.slice(1, 2)])
        batches = list(_arrow_strings_batches(chunked, file, 100))
        assert documents_of(batches) == [b"doc 3", b"doc 4", b"doc 5", b"doc 6", b"doc 4", b"doc 5"]
        assert batches[1].place(0) == "x.parquet row 105, text byte 0"


def test_parquet_errors(tmp_path):
    path = parquet(tmp_path / "d.parquet", ["a", "b"])
    with pytest.raises(
        SourceError, match=r"d\.parquet: no column 'body'; columns: \['id', 'text'\]"
    ):
        resolve_source(path, text_column="body")
    with pytest.raises(SourceError, match=r"d\.parquet: column 'id' has type int64, not string"):
        resolve_source(path, text_column="id")
    nulls = parquet(tmp_path / "n.parquet", ["a", "b", "c", "d", None, "f"], row_group_size=2)
    with pytest.raises(SourceError, match=r"n\.parquet row 5: the 'text' value is null"):
        batches_of(nulls)
    garbage = write(tmp_path / "g.parquet", b"not parquet at all")
    with pytest.raises(SourceError, match=r"g\.parquet: not a readable Parquet file"):
        resolve_source(garbage)
    with pytest.raises(ValueError, match=r"compressed Parquet"):
        resolve_source(write(tmp_path / "d.parquet.gz", path.read_bytes()))


# ---------------------------------------------------------------------------------------------
# Directories, globs, lists, URLs


@pytest.fixture
def tree(tmp_path):
    """A directory of mixed formats, nested, with hidden and empty files to skip."""
    root = tmp_path / "data"
    (root / "b" / "c").mkdir(parents=True)
    (root / ".git").mkdir()
    write(root / ".git" / "HEAD", b"hidden")
    write(root / ".hidden.txt", b"hidden")
    write(root / "_SUCCESS", b"")
    write(root / "a.txt", b"text a")
    write(root / "b" / "c" / "d.jsonl.gz", jsonl(["d1", "d2"]))
    write(root / "b" / "e.txt.bz2", b"text e")
    parquet(root / "b-f.parquet", ["f1", "f2", "f3"])
    write(root / "z.jsonl", jsonl(["z1"]))
    return root


EXPECTED_TREE = [
    ("a.txt", [b"text a"]),
    ("b/c/d.jsonl.gz", [b"d1", b"d2"]),
    ("b/e.txt.bz2", [b"text e"]),
    ("b-f.parquet", [b"f1", b"f2", b"f3"]),
    ("z.jsonl", [b"z1"]),
]


def contents(batches):
    """[(file name, its documents)] in order; the text of a text file counts as one document."""
    out = []
    for batch in batches:
        name = batch.where.name.removesuffix(" (decompressed)")
        if not out or out[-1][0] != name:
            out.append((name, [] if batch.documents else [b""]))
        if batch.documents:
            out[-1][1].extend(documents_of([batch]))
        else:
            out[-1][1][0] += text_of([batch])
    return out


def test_directory_recursive_sorted_hidden_and_empty_skipped(tree):
    assert contents(batches_of(tree)) == [(str(tree / name), docs) for name, docs in EXPECTED_TREE]


def test_glob_and_list_mixing_formats(tree):
    got = contents(batches_of([str(tree / "**" / "*.jsonl*"), tree / "a.txt", [tree / "b"]]))
    names = ["b/c/d.jsonl.gz", "z.jsonl", "a.txt", "b/c/d.jsonl.gz", "b/e.txt.bz2"]
    assert got == [(str(tree / name), dict(EXPECTED_TREE)[name]) for name in names]


def test_tilde_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path / "t.txt", b"home text")
    assert text_of(batches_of("~/t.txt")) == b"home text"


def test_fsspec_file_and_memory_urls(tree):
    fsspec = pytest.importorskip("fsspec")
    expected = [(f"file://{tree / name}", docs) for name, docs in EXPECTED_TREE]
    assert contents(batches_of(f"file://{tree}")) == expected
    memory = fsspec.filesystem("memory")
    memory.pipe("/corpus/a.jsonl", jsonl(["m1", "m2"]))
    memory.pipe("/corpus/sub/b.txt.gz", gzip.compress(TEXT.encode()))
    memory.pipe("/corpus/.hidden", b"x")
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"text": ["p1", "p2"]}), buf, row_group_size=1)
    memory.pipe("/corpus/sub/c.parquet", buf.getvalue().to_pybytes())
    got = contents(batches_of("memory://corpus", 100, [EOT]))
    assert got == [
        ("memory:///corpus/a.jsonl", [b"m1", b"m2"]),
        ("memory:///corpus/sub/b.txt.gz", [TEXT.encode()]),
        ("memory:///corpus/sub/c.parquet", [b"p1", b"p2"]),
    ]
    assert [name for name, _ in contents(batches_of("memory://corpus/**/*.txt.gz"))] == [
        "memory:///corpus/sub/b.txt.gz"
    ]
    with pytest.raises(FileNotFoundError, match="memory://corpus/nothing"):
        resolve_source("memory://corpus/nothing")


def test_units_are_independent_and_in_source_order(tmp_path):
    path = write(tmp_path / "t.txt", TEXT.encode())
    units = plan_units(resolve_source([path, path]), chunk_bytes=50, special_tokens=[EOT])
    assert len(units) > 20
    forward = [read_unit(u) for u in units]
    backward = [list(read_unit(u)) for u in reversed(units)][::-1]
    assert [text_of(list(b)) for b in forward] == [text_of(b) for b in backward]


# ---------------------------------------------------------------------------------------------
# Bad sources


def test_bad_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="corpus file not found: 'missing.txt'"):
        resolve_source("missing.txt")
    with pytest.raises(FileNotFoundError, match=r"no file matches the pattern '.*\*\.jsonl'"):
        resolve_source(str(tmp_path / "*.jsonl"))
    with pytest.raises(ValueError, match="corpus file is empty"):
        resolve_source(write(tmp_path / "empty.txt", b""))
    with pytest.raises(ValueError, match="corpus file is empty"):
        resolve_source([tmp_path / "empty.txt"])
    (tmp_path / "d").mkdir()
    write(tmp_path / "d" / ".only_hidden", b"x")
    with pytest.raises(ValueError, match=r"no files in directory .*'\.' are skipped"):
        resolve_source(tmp_path / "d")
    write(tmp_path / "d" / "e1.txt", b"")
    with pytest.raises(ValueError, match="every file of the source is empty"):
        resolve_source([tmp_path / "d", tmp_path / "empty.txt"])
    with pytest.raises(ValueError, match="empty list"):
        resolve_source([])
    with pytest.raises(TypeError, match="not int"):
        resolve_source(3)
    with pytest.raises(TypeError, match="not bytes.*iterable of str"):
        resolve_source(b"some text")
    text = write(tmp_path / "t.txt", b"abc")
    assert [f.path for f in resolve_source([tmp_path / "empty.txt", text])] == [str(text)]
    empty_parquet = write(tmp_path / "d" / "empty.parquet", b"")
    assert [f.path for f in resolve_source([tmp_path / "d", text])] == [str(text)]
    with pytest.raises(ValueError, match="corpus file is empty"):
        resolve_source(empty_parquet)


@pytest.mark.parametrize(
    "suffix, damage",
    [
        (".gz", lambda c: c[: len(c) // 2]),
        (".gz", lambda c: b"garbage" * 9),
        (".bz2", lambda c: c[:-10]),
        (".xz", lambda c: b"garbage" * 9),
        (".zst", lambda c: c[: len(c) // 2]),
        (".zst", lambda c: b"garbage" * 9),
    ],
)
@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_corrupt_archives_name_the_file(tmp_path, suffix, damage, kind):
    data = COMPRESS[suffix](jsonl([f"document {i} " * 20 for i in range(200)]))
    path = tmp_path / f"d.{kind}{suffix}"
    path.write_bytes(damage(data))
    with pytest.raises(
        SourceError, match=re.escape(str(path)) + r": cannot read \w+ data, the file is corrupt"
    ):
        batches_of(path, 1000)


# ---------------------------------------------------------------------------------------------
# Iterables of str


@settings(max_examples=60)
@given(docs=documents_st, batch_bytes=st.integers(1, 80))
def test_iter_text_batches_preserves_documents(docs, batch_bytes):
    batches = list(iter_text_batches((d for d in docs), batch_bytes=batch_bytes))
    assert documents_of(batches) == [d.encode() for d in docs]
    for batch in batches:  # a batch closes at the first document that brings it to batch_bytes
        assert len(batch.doc_ends) == 1 or batch.doc_ends[-2] < batch_bytes
    assert all(len(batch.data) >= batch_bytes for batch in batches[:-1])


def test_iter_text_batches_names_items_and_checks_types():
    batches = list(iter_text_batches(iter(["ab", "", "cdé"]), batch_bytes=2))
    assert [documents_of([b]) for b in batches] == [[b"ab"], [b"", "cdé".encode()]]
    assert batches[1].place(3) == "item at index 2 of texts, text byte 3"
    with pytest.raises(TypeError, match="item at index 2 of texts is bytes, not str"):
        list(iter_text_batches(iter(["a", "b", b"c"]), batch_bytes=10))
    with pytest.raises(TypeError, match="not a single str"):
        iter_text_batches("a whole text", batch_bytes=10)
    with pytest.raises(InvalidUTF8Error, match="item at index 1 of texts: lone surrogate U\\+DC00"):
        list(iter_text_batches(["a", "\udc00"], batch_bytes=10))
    replaced = iter_text_batches(["a", "\udc00\ud83d\ude00"], batch_bytes=10, errors="replace")
    assert documents_of(replaced) == [b"a", "\ufffd\U0001f600".encode()]


def test_iter_text_batches_is_lazy():
    def endless():
        i = 0
        while True:
            yield f"document {i}"
            i += 1

    batches = iter_text_batches(endless(), batch_bytes=100)
    assert len(documents_of([next(batches), next(batches)])) > 10


def test_encode_document_policy():
    assert encode_document("plain") == b"plain"
    assert (
        encode_document("a\ud800b\udfff\ud800\udc00", "replace")
        == "a\ufffdb\ufffd\U00010000".encode()
    )
    with pytest.raises(InvalidUTF8Error, match="doc 7: lone surrogate U\\+D800 at character 1"):
        encode_document("a\ud800", "strict", lambda: "doc 7")
