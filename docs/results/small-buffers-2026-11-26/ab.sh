#!/bin/bash
for rep in 1 2 3; do
for job in "randread 4k 128" "randwrite 4k 128" "randread 16k 64" "randread 128k 32"; do
for b in b48a7c9 small1; do
  echo "$rep $b $job $($(dirname $0)/bufs.sh /work/wt/bin/iopace-$b $job)"
done; done; done
