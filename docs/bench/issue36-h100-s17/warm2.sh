P='import sys,json; sys.path.insert(0,"benchmarks")
from pathlib import Path
from gpu_dflash import cache_env
from first_step import first_step
base=Path(sys.argv[1])
env={**cache_env(base/"b"),"DFLASH_CACHE_DIR":str(base/"dflash-cache"),"ENVGUARD_CACHE_DIR":str(base/"envguard-cache")}
r=first_step("qwen3-8b-shape", base/("run-w"+sys.argv[3]), env, 40.0, ("--set=mega_cache="+str(base/"store"),))
print(sys.argv[2], sys.argv[3], round(r.get("first_step_s",-1),2), {k:round(v,2) for k,v in r.get("start_s",{}).items()}, flush=True)'
for i in 1 2; do
 (cd .abref && python3 -c "$P" /tmp/dflash-start-23v8m3wn old $i)
 python3 -c "$P" /tmp/dflash-start-smei0ru5 new $i
done
