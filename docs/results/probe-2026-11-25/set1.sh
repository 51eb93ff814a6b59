#!/bin/sh
# hypothesis 1 and the size/direction split, one pass; prints uptime first
cd /work/wt/probe-data
date -u; uptime
F=./fiopt.sh
$F mix7030-4k64k 32 70 4k/50:64k/50
$F mix7030-4k64k 128 70 4k/50:64k/50
$F mix7030-4k64k 256 70 4k/50:64k/50
$F read-4k64k 32 100 4k/50:64k/50
$F read-4k64k 256 100 4k/50:64k/50
$F read-64k 32 100 64k/100
$F mix7030-64k 32 70 64k/100
$F write-64k 32 0 64k/100
$F read-4k 32 100 4k/100
$F mix7030-4k64k 32 70 4k/50:64k/50
uptime
