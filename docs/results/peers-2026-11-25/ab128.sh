#!/bin/bash
# 128 KiB reads at QD 32 over Unix and TCP, two builds alternating, 3 pairs.
# BASE=path NEW=path [OUT=dir] sh ab128.sh   (from the repository root)
: "${BASE:?path to the older iopace}" "${NEW:?path to the newer iopace}"
OUT=${OUT:-bench-out/ab128}
for i in 1 2 3; do
  for b in base new; do
    bin=$BASE; [ $b = new ] && bin=$NEW
    REPS=1 RUNTIME=5 SERVERS=iopace-malloc TRANSPORTS="unix tcp" JOBS="randread:128k:32" \
      IOPACE=$bin OUT=$OUT/$b-$i python3 bench/peers.py 2>&1 | grep 'rep 1' | sed "s/^/$b /"
  done
done
