#!/bin/bash
# issue 36, session 25: GPU tests, the 8B-shape step with the optimizer after and before (alternating), the optimizer step alone
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt 2>&1
python3 -c "import torch,triton;print(torch.__version__,torch.version.git_version,triton.__version__)" > $OUT/versions.txt 2>&1
timeout 120 python3 benchmarks/gpu_dflash.py --out $OUT/t --stages gpu-tests > $OUT/t.log 2>&1
cp dflash/optim.py devref/optim_after.py
for i in 1 2; do
  timeout 75 python3 benchmarks/gpu_dflash.py --out $OUT/m-new$i --stages train --train-attention flex > $OUT/m-new$i.log 2>&1
  cp devref/optim_before.py dflash/optim.py
  timeout 75 python3 benchmarks/gpu_dflash.py --out $OUT/m-before$i --stages train --train-attention flex > $OUT/m-before$i.log 2>&1
  cp devref/optim_after.py dflash/optim.py
done
timeout 60 python3 benchmarks/optimizer_step.py --device cuda --out $OUT/opt/optimizer.json --reps 3 --steps 10 > $OUT/opt.log 2>&1
echo done
