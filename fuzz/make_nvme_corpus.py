#!/usr/bin/env python3
"""Writes the seed corpus for the `nvme_decode` fuzz target (fuzz/corpus/nvme_decode).

The first byte is the harness's mode: bit 0 host (else controller), bit 1
already negotiated, bits 3:2 the digests then (header, data)."""
import os
import struct

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "nvme_decode")
os.makedirs(out, exist_ok=True)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def pdu(ty, fields, hlen, data=b"", hd=False, dd=False, flags=0, digested=True):
    hd = hd and digested
    dd = dd and digested and bool(data)
    pdo = (hlen + (4 if hd else 0)) if data else 0
    plen = (pdo or hlen + (4 if hd else 0)) + len(data) + (4 if dd else 0)
    flags |= (1 if hd else 0) | (2 if dd else 0)
    head = struct.pack("<BBBBI", ty, flags, hlen, pdo, plen) + fields
    head = head.ljust(hlen, b"\0")
    body = head + (struct.pack("<I", crc32c(head)) if hd else b"")
    if data:
        body += data + (struct.pack("<I", crc32c(data)) if dd else b"")
    return body


def icreq(dgst=0, hpda=0):
    return pdu(0, struct.pack("<HBBI", 0, hpda, dgst, 0), 128, digested=False)


def icresp(dgst=0):
    return pdu(1, struct.pack("<HBBI", 0, 0, dgst, 131072), 128, digested=False)


def sqe(opc, cid, nsid=1, cdw10=0, cdw12=0, sgl_len=0, sgl_id=0x5A):
    s = struct.pack("<BBHI", opc, 0x40, cid, nsid) + b"\0" * 16
    s += struct.pack("<QI3xB", 0, sgl_len, sgl_id)
    s += struct.pack("<IIIIII", cdw10, 0, cdw12, 0, 0, 0)
    return s


def capsule(s, data=b"", **kw):
    return pdu(4, s, 72, data, **kw)


def data_pdu(ty, cid, ttag, off, data, flags=4, **kw):
    return pdu(ty, struct.pack("<HHII", cid, ttag, off, len(data)), 24, data, flags=flags, **kw)


def term(ty, fes, fei, data=b""):
    return pdu(ty, struct.pack("<HI", fes, fei), 24, data, digested=False)


connect = capsule(sqe(0x7F, 1, nsid=1, sgl_len=1024, sgl_id=0x01), b"\0" * 1024)
cases = {
    "ctrl_plain": b"\0" + icreq() + connect + capsule(sqe(2, 2, cdw12=7, sgl_len=4096))
    + capsule(sqe(1, 3, sgl_len=8, sgl_id=0x01), b"A" * 8) + data_pdu(6, 4, 1, 0, b"B" * 64)
    + term(2, 1, 4, b"\x04\0\x48\0"),
    "ctrl_digests": b"\0" + icreq(3) + capsule(sqe(1, 3, sgl_len=16, sgl_id=0x01), b"C" * 16, hd=True, dd=True)
    + data_pdu(6, 3, 1, 0, b"D" * 32, hd=True, dd=True),
    "ctrl_negotiated_hd": bytes([2 | 4]) + capsule(sqe(6, 1, cdw10=1, sgl_len=4096), hd=True)
    + data_pdu(6, 1, 1, 0, b"E" * 8, hd=True),
    "host_plain": b"\x01" + icresp() + pdu(5, b"\0" * 12 + struct.pack("<HH", 1, 0), 24)
    + data_pdu(7, 2, 0, 0, b"F" * 32, flags=0x0C) + pdu(9, struct.pack("<HHII", 3, 1, 0, 4096), 24),
    "host_digests": b"\x01" + icresp(3) + data_pdu(7, 2, 0, 0, b"G" * 32, flags=0x04, hd=True, dd=True)
    + term(3, 3, 0),
    "bad_type": b"\0" + icreq() + b"\x42\0\x18\0\x18\0\0\0" + b"\0" * 16,
    "bad_plen": b"\0" + icreq() + b"\x04\0\x48\0\x10\0\0\0" + b"\0" * 64,
    "huge_plen": b"\0" + icreq() + b"\x04\0\x48\0\xff\xff\xff\xff",
    "pdo_in_header": b"\0" + icreq() + bytes([4, 0, 72, 8]) + struct.pack("<I", 80) + b"\0" * 72,
    "half_pdu": b"\0" + icreq() + connect[:40],
}
for name, data in cases.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
print(f"wrote {len(cases)} files to {out}")
