#!/usr/bin/env python3
"""Writes the seed corpus for the `decode` fuzz target (fuzz/corpus/decode)."""
import os
import struct

IHAVEOPT = 0x49484156454F5054
REQ = 0x25609513
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "decode")
os.makedirs(out, exist_ok=True)


def opt(code, data=b""):
    return struct.pack(">QII", IHAVEOPT, code, len(data)) + data


def s32(b):
    return struct.pack(">I", len(b)) + b


def go(name=b"", infos=()):
    return opt(7, s32(name) + struct.pack(">H", len(infos)) + b"".join(struct.pack(">H", i) for i in infos))


def meta(code, name, queries):
    return opt(code, s32(name) + struct.pack(">I", len(queries)) + b"".join(s32(q) for q in queries))


def req(cmd, off, length, flags=0, cookie=1, payload=b""):
    return struct.pack(">IHHQQI", REQ, flags, cmd, cookie, off, length) + payload


EXT_REQ = 0x21E41C71
PAYLOAD_LEN = 1 << 5


def ext_req(cmd, off, length, flags=0, cookie=1, payload=b""):
    return struct.pack(">IHHQQQ", EXT_REQ, flags, cmd, cookie, off, length) + payload


flags = struct.pack(">I", 3)
full = flags + opt(8) + meta(10, b"default", [b"base:allocation"]) + go(b"default", [1, 2, 3])
cases = {
    "go_read_write": full + req(0, 0, 4096) + req(1, 4096, 8, payload=b"A" * 8) + req(3, 0, 0) + req(2, 0, 0),
    "export_name": struct.pack(">I", 1) + opt(1, b"default") + req(0, 0, 512),
    "list_and_unknown": flags + opt(3) + opt(99, b"xyz") + opt(3, b"bad") + opt(2),
    "info_bad_counts": flags + opt(6, s32(b"default") + struct.pack(">H", 5)) + go(),
    "meta_before_structured": flags + meta(10, b"default", [b"base:allocation"]) + meta(9, b"default", []),
    "oversized_option": flags + struct.pack(">QII", IHAVEOPT, 6, 70000) + b"\0" * 70000 + go(),
    "bad_option_magic": flags + b"\xde\xad" * 8,
    "bad_client_flags": struct.pack(">I", 0xFFFF),
    "bad_request_magic": full + b"\x12\x34\x56\x78" + b"\0" * 24,
    "out_of_range": full + req(0, 1 << 40, 4096) + req(1, (1 << 30) - 1, 2, payload=b"zz") + req(4, 1 << 31, 1 << 20),
    "bad_flags": full + req(0, 0, 4096, flags=0xFFFF) + req(6, 0, 4096, flags=0x1F) + req(7, 0, 4096, flags=8) + req(77, 0, 0),
    "oversized_read": full + req(0, 0, 0xFFFFFFFF) + req(1, 0, 64 << 20),
    "read_only_export": flags + opt(8) + go(b"ro") + req(1, 0, 4, payload=b"abcd") + req(4, 0, 4096),
    "truncated": full[:37],
    "extended_headers": flags + opt(11) + opt(8) + meta(10, b"default", [b"base:allocation"]) + go(b"default")
    + ext_req(1, 0, 8, flags=PAYLOAD_LEN, payload=b"B" * 8) + ext_req(0, 0, 8) + ext_req(7, 0, 1 << 36)
    + ext_req(4, 0, 1 << 33) + ext_req(4, 0, 16, flags=PAYLOAD_LEN, payload=b"\0" * 16) + ext_req(1, 0, 4) + ext_req(3, 0, 0),
    "extended_then_export_name": flags + opt(11, b"x") + opt(11) + opt(1, b"default") + ext_req(0, 0, 512),
}
for name, data in cases.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
print(f"wrote {len(cases)} files to {out}")
