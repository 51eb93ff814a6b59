#!/usr/bin/env bash
# Peer benchmark: see scripts/peers.py for the knobs (REPS, RUNTIME, SERVERS, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/iopace ] || cargo build --release -p iopace
exec python3 scripts/peers.py "$@"
