#!/bin/bash
for i in 1 2; do for pin in yes no; do for qd in 32 64 128 256; do for g in 2 16 32 64; do
 if [ $pin = yes ]; then export PIN_S=0 PIN_F=1; else unset PIN_S PIN_F; fi
 echo -n "pin=$pin qd=$qd g=$g "; IOPACE_GATHER_MIN=$g QD=$qd RT=3 /tmp/q1/run.sh /work/wt/bin/iopace-gmin randread ""
done; done; done; done
