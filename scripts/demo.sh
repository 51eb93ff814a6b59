#!/usr/bin/env bash
# `make demo`: `iopace bench scenarios/quick.toml` on the embedded default
# config. Two initiator hosts in network namespaces, each behind a veth
# shaped to 1 Gbit/s, read from iopace with pacing off (`none`) and `auto`;
# the seed-style tables show bandwidth and buffers in flight per mode.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${IOPACE_BIN:-${CARGO_TARGET_DIR:-target}/release/iopace}
OUT=${OUT:-bench-out/demo}
if [ "$(id -u)" != 0 ]; then
    echo "demo: network namespaces and tc need root: run \`sudo make demo\`" >&2
    exit 1
fi
"$BIN" bench scenarios/quick.toml --out "$OUT" "$@"
