"""Pre-tokenization patterns, and which compiled scanner implements each.

The reference semantics of a pattern are those of the `regex` module. The compiled scanners
(`nbbpe/scanners/`) implement three families exactly; a pattern is recognised by its string:
nbbpe's constants, or the spelling tiktoken uses (`tiktoken_ext/openai_public.py`).
Any other pattern runs on `regex`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import regex

# GPT-2's pattern as released with GPT-2 (and in the CS336 assignment).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# tiktoken's spelling of it (gpt2, r50k_base, p50k_base): the same pre-tokens, faster in regex.
TIKTOKEN_GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
# cl100k_base (GPT-4; Llama 3 uses it nearly verbatim), exactly as tiktoken spells it.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
# o200k_base (GPT-4o), exactly as tiktoken spells it.
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# Pattern string -> the family of the compiled scanner that finds exactly its pre-tokens.
SCANNER_FAMILIES = {
    GPT2_PATTERN: "gpt2",
    TIKTOKEN_GPT2_PATTERN: "gpt2",
    CL100K_PATTERN: "cl100k",
    O200K_PATTERN: "o200k",
}


def compile_pattern(pattern: str) -> regex.Pattern:
    """`pattern` compiled, refusing capturing groups: pre-tokens are whole matches."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
    compiled = regex.compile(pattern)
    if compiled.groups:
        raise ValueError(f"pattern {pattern!r} has capturing groups; use (?:...) so that "
                         "pre-tokens are whole matches")
    return compiled


def scanner_family(pattern: str) -> str | None:
    """The compiled scanner family ("gpt2", "cl100k", "o200k") for `pattern`, or None."""
    return SCANNER_FAMILIES.get(pattern)


def validate_special_tokens(special_tokens: Iterable[str] | None) -> list[str]:
    """Return the special tokens as a list, or raise naming what is wrong with them."""
    if special_tokens is None:
        return []
    if isinstance(special_tokens, (str, bytes)):
        raise TypeError(
            "special_tokens must be a list of strings, not a single "
            f"{type(special_tokens).__name__} (did you mean [{special_tokens!r}]?)"
        )
    tokens = list(special_tokens)
    seen: set[str] = set()
    for token in tokens:
        if not isinstance(token, str):
            raise TypeError(f"special token {token!r} is a {type(token).__name__}, not a str")
        if not token:
            raise ValueError("special tokens must be non-empty strings; got ''")
        if token in seen:
            raise ValueError(f"special token {token!r} is given more than once")
        seen.add(token)
    return tokens


def special_token_regex(special_tokens: Sequence[str]) -> regex.Pattern | None:
    """A regex matching any special token, longest first where several start at one place."""
    if not special_tokens:
        return None
    by_length = sorted(special_tokens, key=len, reverse=True)
    return regex.compile("|".join(regex.escape(token) for token in by_length))
