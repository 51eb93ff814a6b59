#!/usr/bin/env python3
"""Packs a fuzz corpus folder into one file, or unpacks it.

    python3 fuzz/corpus.py pack corpus/decode corpus/decode.bin
    python3 fuzz/corpus.py unpack corpus/decode.bin corpus/decode

The tree keeps each target's corpus as one packed file (records of a
big-endian u16 name length, the name, a u32 data length and the data), and
the replay tests read it (`proto::fuzzing::packed_inputs`); cargo-fuzz
wants the folder, which `unpack` restores.
"""
import os
import struct
import sys


def pack(folder, out):
    with open(out, "wb") as f:
        for name in sorted(os.listdir(folder)):
            data = open(os.path.join(folder, name), "rb").read()
            raw = name.encode()
            f.write(struct.pack(">H", len(raw)) + raw + struct.pack(">I", len(data)) + data)


def unpack(packed, folder):
    os.makedirs(folder, exist_ok=True)
    b = open(packed, "rb").read()
    i = 0
    while i < len(b):
        (n,) = struct.unpack_from(">H", b, i)
        name = b[i + 2:i + 2 + n].decode()
        i += 2 + n
        (m,) = struct.unpack_from(">I", b, i)
        open(os.path.join(folder, name), "wb").write(b[i + 4:i + 4 + m])
        i += 4 + m


if __name__ == "__main__":
    {"pack": pack, "unpack": unpack}[sys.argv[1]](sys.argv[2], sys.argv[3])
