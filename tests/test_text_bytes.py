"""Str's UTF-8 read where CPython holds it, or gathered by a compiled loop (text_bytes), and the
encoding paths that use it, against `str.encode` and the bytes API."""

import gc
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbbpe.tokenizer
from nbbpe import text_bytes
from nbbpe.kernel_args import address, bytes_at
from nbbpe.text_bytes import ascii_bytes, gather_utf8
from nbbpe.tokenizer import _utf8

FIXTURES = Path(__file__).parent / "fixtures"
EOT = "<|endoftext|>"
# Characters at the edges of UTF-8's lengths and of the surrogates, and of each way CPython holds
# a str (1 byte a character up to U+00FF, 2 up to U+FFFF, else 4).
EDGES = "\x00\x7f\x80\xff\u0100\u07ff\u0800\ud7ff\ue000\uffff\U00010000\U0010ffff"


def gathered(texts, spans=None, room=None, addresses=None):
    """(what gather_utf8 returns, the bytes it wrote, where each text ended) for `texts`, whole
    or by `spans` ((start, end) each), into a buffer of `room` bytes (default: as asked); with
    `addresses` (an int64 array, one per text), in place (the bytes are then all the buffer's,
    untouched ones 0xAA, and a fourth item: the bytes at each address, read before the buffer
    is let go of)."""
    bounds = np.array([at for span in spans for at in span] if spans else [], dtype=np.int64)
    chars = sum(end - start for start, end in spans) if spans else sum(map(len, texts))
    out = np.full((4 * chars if room is None else room) + 8, 0xAA, dtype=np.uint8)
    ends = np.full(len(texts), -7, dtype=np.int64)
    in_place = np.empty(0, dtype=np.int64) if addresses is None else addresses
    w = gather_utf8(id(texts), len(texts), bounds, out[: len(out) - 8], ends, in_place)
    assert (out[len(out) - 8 :] == 0xAA).all()  # nothing past the buffer is touched
    if addresses is None:
        return w, out[: max(w, 0)].tobytes(), ends.tolist()
    starts = [0, *ends[:-1]]
    at_addresses = ([bytes_at(int(a), int(e - s)).tobytes()
                     for a, s, e in zip(addresses, starts, ends)] if w >= 0 else None)
    return w, out[: len(out) - 8].tobytes(), ends.tolist(), at_addresses


def transcoded(text, start=0, end=None):
    """(what gather_utf8 returns, the bytes it wrote) for text[start:end] alone."""
    w, written, _ = gathered([text], [(start, len(text) if end is None else end)])
    return w, written


# Any characters, lone surrogates too (st.text leaves them out).
ANY_TEXT = st.text(st.one_of(st.characters(), st.sampled_from("\ud800\udbff\udc00\udfff")))


@given(st.lists(ANY_TEXT, max_size=6), st.data())
@settings(max_examples=300)
def test_gather_utf8_writes_what_str_encode_gives(texts, data):
    spans = [(a, data.draw(st.integers(a, len(text))))
             for text in texts for a in [data.draw(st.integers(0, len(text)))]]
    for bounds in (None, spans):
        parts = texts if bounds is None else [text[a:b] for text, (a, b) in zip(texts, spans)]
        w, written, ends = gathered(texts, bounds)
        if any("\ud800" <= c <= "\udfff" for part in parts for c in part):
            assert w == -1  # a lone surrogate: the caller makes it the slow way
            continue
        assert written == "".join(parts).encode() and w == len(written)
        assert ends == np.cumsum([len(p.encode()) for p in parts], dtype=np.int64).tolist()


@given(st.lists(ANY_TEXT, max_size=6), st.data())
@settings(max_examples=300)
def test_gather_utf8_in_place_leaves_ascii_texts_where_they_are(texts, data):
    texts = [text if data.draw(st.booleans()) else text.encode("ascii", "replace").decode()
             for text in texts]  # ASCII ones among the others
    spans = [(a, data.draw(st.integers(a, len(text))))
             for text in texts for a in [data.draw(st.integers(0, len(text)))]]
    for bounds in (None, spans):
        parts = texts if bounds is None else [text[a:b] for text, (a, b) in zip(texts, spans)]
        addresses = np.full(len(texts), -7, dtype=np.int64)
        w, written, ends, at_addresses = gathered(texts, bounds, addresses=addresses)
        if any("\ud800" <= c <= "\udfff" for part in parts for c in part):
            assert w == -1
            continue
        utf8 = [part.encode() for part in parts]
        assert ends == np.cumsum([len(b) for b in utf8], dtype=np.int64).tolist()
        assert w == sum(map(len, utf8))
        # only the texts that are not ASCII are written to the buffer, end to end ...
        others = b"".join(b for b, text in zip(utf8, texts) if not text.isascii())
        assert written[: len(others)] == others and set(written[len(others) :]) <= {0xAA}
        for k, (text, part) in enumerate(zip(texts, utf8)):
            # ... and each text's UTF-8 is at its address: an ASCII one in the str itself
            assert at_addresses[k] == part
            if text.isascii():
                start = 0 if bounds is None else spans[k][0]
                assert addresses[k] == address(ascii_bytes(text)) + start


@pytest.mark.parametrize("filler", ["a", "\xe9", "\u0416", "\U0001f642"])  # each str kind
def test_gather_utf8_on_every_kind_and_edge(filler):
    # runs of ASCII (copied eight at a time) broken at every place by the edge characters
    texts = []
    for k, c in enumerate(EDGES):
        text = filler * 3 + "plain ascii run " * 2 + c + "x" * k + filler + c
        assert transcoded(text) == (len(text.encode()), text.encode())
        assert transcoded(text, 1, len(text) - 1)[1] == text[1:-1].encode()
        texts.append(text)
    texts += ["", "ascii only", "".join(["made ", "here"]) * 9]
    assert gathered(texts)[1] == "".join(texts).encode()


def test_gather_utf8_says_what_it_cannot_do():
    for surrogate in ("\ud800", "\udbff", "\udc00", "\udfff"):
        text = "abcdefghij" + surrogate + "k\U0001f642"
        assert transcoded(text)[0] == -1
        assert transcoded(text, 0, 10) == (10, b"abcdefghij")  # not within the range asked
        assert transcoded(text, 11)[1] == "k\U0001f642".encode()
    assert transcoded("\ud83d\ude42")[0] == -1  # a pair of lone surrogates: `_utf8` joins them
    for start, end in ((0, 4), (-1, 2), (2, 1)):  # spans out of the text's bounds
        assert transcoded("abc", start, end)[0] == -1
    class Text(str):  # a subclass's characters are not in its object: not read
        pass

    for text in (Text("abc"), Text("caf\xe9"), np.str_("abc")):
        assert gathered(["ok", text])[0] == -1
    # too little room: -2 - the room it needs (4 bytes a character), nothing written
    texts = ["abc", "\xe9t\xe9"]
    assert gathered(texts, room=23) == (-2 - 24, b"", [-7, -7])
    assert gathered(texts, room=24)[:2] == (8, "abc\xe9t\xe9".encode())
    assert gathered(texts, [(1, 3), (0, 2)], room=15)[0] == -2 - 16  # 4 characters asked
    assert gathered(texts, [(1, 3), (0, 2)], room=16)[:2] == (5, "bc\xe9t".encode())
    # in place, room only for the texts that are not ASCII
    addresses = np.zeros(2, dtype=np.int64)
    assert gathered(texts, room=11, addresses=addresses)[0] == -2 - 12
    w, written, _, at_addresses = gathered(texts, room=12, addresses=addresses)
    assert w == 8 and written[:5] == "\xe9t\xe9".encode() and set(written[5:]) <= {0xAA}
    assert at_addresses == [b"abc", "\xe9t\xe9".encode()]


def test_str_lengths_of_a_list_or_none_at_what_is_not_a_str():
    class Text(str):
        pass

    texts = ["", "abc", "caf\xe9", "\U0001f642" * 3, "x" * 1000, "\ud800"]
    lengths, total, _ = text_bytes.lengths_of(texts)
    assert lengths.tolist() == [0, 3, 4, 3, 1000, 1] and total == 1011
    for other in (Text("a"), b"a", None, 7):  # a subclass is read the slow way too
        assert text_bytes.lengths_of(texts + [other] + texts) is None
    assert text_bytes.lengths_of([])[1:] == (0, 0)


@given(st.lists(st.text(alphabet=st.sampled_from("ab \xe9\ud800\udc00" + EDGES)), max_size=6))
@settings(max_examples=200, deadline=None)
def test_lengths_of_bounds_the_utf8_by_how_each_str_is_held(texts):
    # The most UTF-8 bytes: a character each for an ASCII str, else 2, 3 or 4 by the bytes a
    # character CPython holds it in (1, 2, 4), whatever its characters; a lone surrogate
    # becomes U+FFFD's 3 bytes. A 2-thread batch's result is allocated for that many ids.
    def width(text):
        held = max(map(ord, text), default=0)
        return 1 if held < 0x80 else 2 if held < 0x100 else 3 if held < 0x10000 else 4

    _, _, most = text_bytes.lengths_of(texts)
    assert most == sum(width(text) * len(text) for text in texts)
    assert most >= sum(len(_utf8(text)) for text in texts)


def test_the_compiling_notice_is_given_for_the_kernel_about_to_be_compiled(gpt2_files,
                                                                             monkeypatch):
    # A process that only ever gathers never caches `str_lengths`: asking for both kernels
    # said "compiling" in every such process, though nothing was compiled.
    from nbbpe import Tokenizer

    state = Tokenizer(*gpt2_files, [EOT])._thread_state()
    notices = []
    looked_for = []
    monkeypatch.setattr(text_bytes, "announce_compiling", lambda: notices.append(1))
    monkeypatch.setattr(text_bytes, "_checked", set())
    monkeypatch.setattr(text_bytes, "_loaded", lambda kernel: False)  # as in a fresh process
    monkeypatch.setattr(text_bytes, "cached", lambda kernel: looked_for.append(kernel) or (
        kernel is text_bytes.gather_utf8))
    for _ in range(2):
        assert text_bytes.gather(["caf\xe9"], state)[0].tobytes() == "caf\xe9".encode()
    assert notices == []
    for _ in range(2):
        assert text_bytes.lengths_of(["ab"])[1] == 2
    assert notices == [1]  # not cached: said once
    # A kernel loaded in this process already (the tokenizer loads both) is not looked for in
    # the cache: reading its index cost a first batch 0.5-2.6 ms before any thread started.
    assert looked_for == [text_bytes.gather_utf8, text_bytes.str_lengths]
    monkeypatch.setattr(text_bytes, "_checked", set())
    monkeypatch.setattr(text_bytes, "_loaded", lambda kernel: True)
    assert text_bytes.lengths_of(["ab"])[1] == 2 and text_bytes.gather(["x"], state) is not None
    assert looked_for == [text_bytes.gather_utf8, text_bytes.str_lengths] and notices == [1]


def test_gather_reads_strs_as_this_cpython_lays_them_out(gpt2_files):
    # The fast path is the one tested here: this CPython's str objects are laid out as the loop
    # reads them. A list the thread makes from a batch goes through it, into the thread's buffer.
    from nbbpe import Tokenizer

    assert text_bytes.gather_layout_known()
    tok = Tokenizer(*gpt2_files, [EOT])
    state = tok._thread_state()
    texts = ["caf\xe9 ", "plain", "\U0001f642!"] * 100
    buf, ends = text_bytes.gather(texts, state)
    assert buf.tobytes() == "".join(texts).encode() and ends[-1] == len(buf)
    assert np.shares_memory(buf, state.utf8)
    assert text_bytes.gather(["ok", "lone \udc80"], state) is None


def test_ascii_bytes_are_the_strs_own_memory_and_keep_it_alive():
    text = "".join(["ascii text, ", str(12345)]) * 1000  # made here: no other reference
    first = ascii_bytes(text)
    second = ascii_bytes(text)
    assert first.__array_interface__["data"][0] == second.__array_interface__["data"][0]
    assert first.tobytes() == text.encode() and first.dtype == np.uint8
    assert not first.flags.writeable
    with pytest.raises(ValueError):
        first[0] = 1
    expected = text.encode()
    part = first[100:200]
    del text, first, second
    gc.collect()
    others = ["y" * len(expected) for _ in range(20)]  # would reuse the str's memory if freed
    assert part.tobytes() == expected[100:200] and len(others) == 20
    text = "".join(["held ", "by its view"])
    before = sys.getrefcount(text)
    view = ascii_bytes(text)[2:]
    assert sys.getrefcount(text) == before + 1  # the view holds the str
    del view
    assert sys.getrefcount(text) == before
    for not_ascii in ("caf\xe9", "\u0416", "\U0001f642", "\ud800"):
        with pytest.raises(ValueError, match="not ASCII"):
            ascii_bytes("ascii, then " + not_ascii)


def long_texts():
    web = (FIXTURES / "web_sample.txt").read_text(encoding="utf-8")
    multi = (FIXTURES / "multi_sample.txt").read_text(encoding="utf-8")
    ascii_web = web.encode("ascii", "ignore").decode()
    return {
        "ascii": ascii_web,
        "latin-1": ascii_web.replace("e", "\xe9"),
        "2 bytes a character": ascii_web.replace("e", "\u0435"),  # Cyrillic
        "4 bytes a character": web + " \U0001f642",
        "multilingual": multi,
        "lone surrogates": ascii_web[:5000] + " \ud800 \ud83d\ude42 " + multi[:5000],
        "special tokens": ascii_web[:3000] + EOT + multi[:3000] + EOT,
    }


def test_texts_longer_than_the_short_path_takes_are_read_in_place(gpt2_files, monkeypatch):
    # A text the short path has no room for (more than `text_room` bytes) goes the long way:
    # its UTF-8 read where the str holds it if ASCII, else transcoded (with a lone surrogate,
    # `_utf8` replaces it); the ids are those of its UTF-8 through the bytes API. A shorter
    # one keeps the short path's one call (which wants bytes: `str.encode`).
    from nbbpe import Tokenizer

    tok = Tokenizer(*gpt2_files, [EOT])
    reference = Tokenizer(*gpt2_files, [EOT])  # (its calls would grow `tok`'s buffers)
    read_in_place, transcodes = [], []
    real_ascii_bytes, real_gather = text_bytes.ascii_bytes, text_bytes.gather

    def gather(texts, state, spans=None):
        chars = sum(map(len, texts)) if spans is None else int((spans[1::2] - spans[::2]).sum())
        transcodes.append(chars)
        return real_gather(texts, state, spans)

    monkeypatch.setattr(text_bytes, "ascii_bytes",
                        lambda text: read_in_place.append(len(text)) or real_ascii_bytes(text))
    monkeypatch.setattr(text_bytes, "gather", gather)
    # (else each text would make room for the next: `encode.encode_text_long`)
    monkeypatch.setattr(nbbpe.encode, "_TEXT_ROOM_GROWS_TO", 0)
    for first in ("a first text", "a second: it readies the short path"):
        tok.encode(first)
    room = tok._thread_state().text_room
    assert room > nbbpe.tokenizer._READ_IN_PLACE_FROM
    for name, text in long_texts().items():
        text = text * (room // len(text) + 1)
        want = reference.encode_utf8(_utf8(text))[0].tolist()
        read_in_place.clear()
        transcodes.clear()
        assert tok.encode(text) == want, name
        assert tok.encode_to_numpy(text).tolist() == want, name
        assert tok.encode_to_numpy(text, np.int64).dtype == np.int64
        if text.isascii():
            assert read_in_place == [len(text)] * 3 and transcodes == [], name
        else:
            assert read_in_place == [] and transcodes == [len(text)] * 3, name
        read_in_place.clear()
        transcodes.clear()
        shorter = text[: room // 4]  # fits the short path whatever its width
        assert tok.encode(shorter) == reference.encode_utf8(_utf8(shorter))[0].tolist(), name
        assert read_in_place == [] and transcodes == [], name
    state = tok._thread_state()
    assert state.text_room == room  # the long way did not grow the short path's buffer
    assert len(state.utf8) >= 4 * room  # the UTF-8 buffer is kept for the thread


@pytest.mark.parametrize("threads", [1, 2])
def test_long_texts_in_a_batch_are_read_in_place(gpt2_files, monkeypatch, threads):
    # Groups of a few long texts, or of pieces of a cut text, are read in place (a lone
    # surrogate sends its group the old way); groups of many short texts are joined as before.
    from nbbpe import Tokenizer

    monkeypatch.setattr(nbbpe.tokenizer, "_READ_IN_PLACE_FROM", 512)
    monkeypatch.setattr(nbbpe.tokenizer, "_GROUP_CHARS", 4000)
    tok = Tokenizer(*gpt2_files, [EOT])
    spans = []
    real = tok._utf8_in_place
    monkeypatch.setattr(tok, "_utf8_in_place", lambda s: spans.append(s) or real(s))
    texts = long_texts()
    batch = list(texts.values()) + ["short", "", "caf\xe9"] * 50 + [texts["ascii"][:700]]
    want = [tok.encode_utf8(_utf8(text))[0].tolist() for text in batch]
    ids, offsets = tok.encode_batch_to_numpy(batch, num_threads=threads)
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want
    assert tok.encode_batch(batch, num_threads=threads) == want
    read = {(id(text), start, end) for group in spans for text, start, end in group}
    # every text long enough to be cut went through in pieces of itself, end to end (the
    # others may share a group with many short texts)
    cut = [text for text in texts.values() if len(text) > 2 * 4000]
    assert len(cut) == 6
    for text in cut:
        pieces = sorted((start, end) for t, start, end in read if t == id(text))
        assert pieces[0][0] == 0 and pieces[-1][1] == len(text), len(pieces)
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))


def test_import_nbbpe_loads_no_numba():
    # The module of the compiled UTF-8 loop imports Numba (0.3 s): the tokenizer imports it
    # only when a long text comes, so that `import nbbpe` and building a Tokenizer stay fast.
    import subprocess

    code = ("import sys, nbbpe; from nbbpe import Tokenizer; "
            "print(sorted(m for m in ('numba', 'llvmlite', 'nbbpe.text_bytes') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
