#!/bin/sh
# One A/B run: scenarios/tune_effect_ab.toml with the cost model and QoS of
# APPLIED (an applied.toml of scripts/tune-effect.sh); `tuned` is NEW_BIN's,
# `tuned_main` BASE_BIN's, `untuned` NEW_BIN's. Holds LOCK for the bench.
# Usage: ab.sh APPLIED OUT_DIR NEW_BIN BASE_BIN
set -eu
applied=$1 out=$2 new=$3 base=$4
cost=$(sed -n '/^\[cost/,/^$/p' "$applied")
qos=$(sed -n '/^\[qos/,$p' "$applied")
uptime
date -u
flock "${LOCK:-/work/wt/bench.lock}" "$new" bench scenarios/tune_effect_ab.toml \
    --var "cost=$cost" --var "qos=$qos" --var "base_bin=$base" --out "$out"
date -u
uptime
