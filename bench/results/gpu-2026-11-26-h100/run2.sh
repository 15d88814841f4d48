#!/bin/bash
# second GPU run: kernels again (allocator test fixed), small shapes beside PyTorch,
# bf16 vs fp32 300-step small GPT, ncu of the bf16 and fp32 steps.
R=$1; G=/tmp/gc2; mkdir -p $G/r
OUT=$G STAGE_LIMIT=60 bench/pytorch/gpu-check.sh run kernels >> $G/all.log 2>&1; echo "kernels rc=$?" >> $G/summary.txt
OUT=$G/small STAGE_LIMIT=60 BSZ=4 SEQ=64 STEPS=20 bench/pytorch/gpu-check.sh run step pytorch >> $G/all.log 2>&1; echo "small step+pytorch rc=$?" >> $G/summary.txt
L=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export HPCRUN_CUDA_LIB_PATH=$L LD_LIBRARY_PATH=$L:${LD_LIBRARY_PATH:-}
for p in fp32 bf16; do
  timeout 60 devbin/hpcrun run --runs-dir $G/r --nproc 1 --device cuda --model gpt --preset small --steps 300 --eval-every 0 --precision $p >> $G/train-$p.log 2>&1; echo "train300 $p rc=$?" >> $G/summary.txt
done
for d in $G/r/*/; do devbin/hpcrun metrics --runs-dir $G/r $(basename $d) >> $G/summary.txt 2>&1; done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for p in bf16 fp32; do
  timeout 120 $NCU --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel devbin/hpcrun bench step --device cuda --precision $p --model gpt2-124m --bsz 4 --seq 1024 --steps 1 --warmup 1 > $G/ncu-$p.txt 2>&1; echo "ncu $p rc=$?" >> $G/summary.txt
done
tar czf $R/gpu-check2.tgz -C $G .
cp $G/summary.txt $R/
cat $G/summary.txt
grep -E "^(--- FAIL|== FAILED|== TIMED)|tokens/s  |peak MiB" $G/all.log
