#!/bin/bash
# third GPU run: the allocator test alone; ncu kernel times of the bf16 and fp32 steps summed by kernel;
# bf16 vs fp32 losses of the small GPT.
R=$1; G=/tmp/gc3; mkdir -p $G/r
L=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export HPCRUN_CUDA_LIB_PATH=$L LD_LIBRARY_PATH=$L:${LD_LIBRARY_PATH:-}
devbin/cuda.test -test.run 'TestGPUAllocator$' -test.v -test.count=1 > $R/alloc.txt 2>&1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for p in bf16 fp32; do
  timeout 100 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --page raw devbin/hpcrun bench step --device cuda --precision $p --model gpt2-124m --bsz 4 --seq 1024 --steps 1 --warmup 1 > $G/ncu-$p.csv 2>$G/ncu-$p.err
  python3 - $G/ncu-$p.csv > $R/ncu-$p.txt <<'PY'
import csv,sys,collections
rows=[l for l in open(sys.argv[1]) if l.startswith('"')]
r=list(csv.DictReader(rows))[1:]
t=collections.Counter(); n=collections.Counter()
for x in r:
    k=x['Kernel Name'][:70]
    try: t[k]+=float(x['gpu__time_duration.sum'].replace(',',''))
    except: pass
    n[k]+=1
tot=sum(t.values())
print('kernels',len(r),'total',tot,'(unit of the csv, 2 steps)')
for k,v in t.most_common(25): print('%6.1f%% %12.0f %5d %s'%(100*v/tot,v,n[k],k))
PY
done
for p in fp32 bf16; do
  devbin/hpcrun run --runs-dir $G/r --nproc 1 --device cuda --model gpt --preset small --steps 50 --eval-every 0 --precision $p > /dev/null 2>&1
done
python3 - $G/r > $R/losses.txt <<'PY'
import json,sys,os,glob
for d in sorted(glob.glob(sys.argv[1]+'/*/')):
    L=[json.loads(l) for l in open(d+'metrics/rank-00000.jsonl')]
    s=[x for x in L if x.get('type')=='step']
    cfg=open(d+'train.toml').read() if os.path.exists(d+'train.toml') else ''
    print(d, [l for l in cfg.splitlines() if 'precision' in l], [(x['step'],repr(x['loss'])) for x in s if x['step'] in (1,2,5,10,50)])
PY
ls $G/r/*/ > /dev/null; cat $R/alloc.txt | tail -20; cat $R/losses.txt; head -30 $R/ncu-bf16.txt; head -30 $R/ncu-fp32.txt; cat $G/ncu-bf16.err | tail -3
