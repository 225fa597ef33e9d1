#!/bin/bash
cd "$(dirname "$0")/.."
cp dflash/optim.py devref/optim_after.py
for i in 1 2; do
  cp devref/optim_before.py dflash/optim.py
  timeout 70 python3 benchmarks/gpu_dflash.py --out $OUT/m-before$i --stages train --train-attention flex > $OUT/m-before$i.log 2>&1
  cp devref/optim_after.py dflash/optim.py
  timeout 70 python3 benchmarks/gpu_dflash.py --out $OUT/m-new$((i+2)) --stages train --train-attention flex > $OUT/m-new$((i+2)).log 2>&1
done
echo done
