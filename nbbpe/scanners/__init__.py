"""Compiled pre-tokenizers: one scanner per pattern family, beside the shared character classes.

A scanner is a Numba function `end = scanner(buf, flags, i, stop)`: given valid UTF-8 `buf`, the
table `classes.char_flags()`, the start `i` of a pre-token and the end `stop` of the text it is
in (the end of a document, or where a special token starts), it returns where that pre-token
ends. Pre-tokens tile the text, so calling it from `i = start` until `i == stop` finds them all.
The kernels that count pre-tokens (training) and encode them take the scanner as an argument.
"""
