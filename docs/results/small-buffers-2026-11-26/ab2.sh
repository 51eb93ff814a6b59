#!/bin/bash
for rep in 1 2 3; do
for job in "randread 16k 64" "randwrite 16k 64" "randread 64k 32" "randread 4k 128"; do
for b in small1 classes; do
  echo "$rep $b $job $($(dirname $0)/bufs.sh /work/wt/bin/iopace-$b $job)"
done; done; done
