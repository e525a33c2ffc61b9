#!/usr/bin/env python3
"""Writes the live demo's token file (scripts/demo): the bytes of text files
(by default this repository's README.md and docs/*.md) as byte-level token
ids 0..255, each a little-endian uint16 — the flat `.bin` format of
Megatron- and nanoGPT-style data that arachne_torch reads (docs/pytorch.md,
"Token files"), for a model with a vocabulary of 256.

    demo_tokens.py OUT.bin [TEXT ...]

Prints the number of tokens written. Exit codes: 0 ok, 2 bad input (no
text, an unreadable file, an output that cannot be written).
"""

import glob
import os
import sys


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        print("usage: demo_tokens.py OUT.bin [TEXT ...]", file=sys.stderr)
        return 2
    out = argv[1]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sources = argv[2:] or [os.path.join(root, "README.md")] + sorted(
        glob.glob(os.path.join(root, "docs", "*.md")))
    data = bytearray()
    for path in sources:
        try:
            with open(path, "rb") as f:
                data += f.read()
        except OSError as e:
            print(f"demo_tokens: {path}: cannot read: {e.strerror}",
                  file=sys.stderr)
            return 2
    if not data:
        print("demo_tokens: the text files are empty", file=sys.stderr)
        return 2
    tokens = bytearray(2 * len(data))
    tokens[0::2] = data  # low byte: the byte; high byte: 0 (little-endian)
    try:
        tmp = out + ".tmp"
        with open(tmp, "wb") as f:
            f.write(tokens)
        os.replace(tmp, out)
    except OSError as e:
        print(f"demo_tokens: {out}: cannot write: {e.strerror}",
              file=sys.stderr)
        return 2
    print(len(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
