#!/bin/bash
# alt.sh REPS RW QD LABEL=BIN:CFG ... -> alternating prof.sh runs, order rotating each rep
REPS=$1; RW=$2; QD=$3; shift 3
specs=("$@")
for r in $(seq $REPS); do
  if (( r % 2 == 0 )); then order=$(printf '%s\n' "${specs[@]}" | tac); else order=$(printf '%s\n' "${specs[@]}"); fi
  for spec in $order; do
    lab=${spec%%=*}; rest=${spec#*=}; bin=${rest%%:*}; cfg=${rest#*:}
    echo -n "$lab r$r "; CFG=$cfg flock /work/wt/bench.lock timeout 60 /tmp/dp/prof.sh $bin $RW $QD
  done
done
