#!/bin/sh
# alternated rounds (3 s each point, 3 rounds): the mix at QD 32 and 256, unloaded latencies (QD 1), references
cd /work/wt/probe-data
date -u; uptime
F=./fiopt.sh
for r in 1 2 3; do
$F mix7030-4k64k 32 70 4k/50:64k/50 3
$F mix7030-4k64k 256 70 4k/50:64k/50 3
$F read-4k 1 100 4k/100 3
$F read-64k 1 100 64k/100 3
$F write-4k 1 0 4k/100 3
$F write-64k 1 0 64k/100 3
$F read-4k 64 100 4k/100 3
$F read-64k 32 100 64k/100 3
done
uptime
