"""One alternating run on disk: plain uv, envguard with symbolic links (HEAD), envguard with
hard links (b760305); each install followed by `envguard snapshot` (the memo's state), with
a 2 s pause so that the last removal is done."""
import os, subprocess, sys, time, statistics
U="/work/main/.venv/bin/uv"; ROOT="/root/b35-bench"; PY=f"{ROOT}/venv/bin/python"
env={k:v for k,v in os.environ.items() if not k.startswith(("UV_","PIP_")) and k!="VIRTUAL_ENV"}
env.update(UV_OFFLINE="1", UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never", ENVGUARD_CACHE_DIR=f"{ROOT}/envguard-cache")
def t(args, extra={}):
    s=time.perf_counter(); p=subprocess.run(args, env={**env, **extra}, capture_output=True, text=True); d=time.perf_counter()-s
    assert p.returncode==0, p.stdout+p.stderr; return d
install=["pip","install","diffusers","openai","pandas","scipy","sqlalchemy"]
reset=[U,"pip","sync","--quiet","--python",PY,"--find-links",f"{ROOT}/wheels",f"{ROOT}/baseline.txt"]
trees={"symbolic (HEAD)": {}, "hard (b760305)": {"PYTHONPATH": "/tmp/hard-b760305"}}
res={k:[] for k in ["plain", *trees, *(f"snapshot after {k}" for k in trees)]}
for i in range(5):
    res["plain"].append(t([U,*install[:2],"--python",PY,*install[2:]])); t(reset); time.sleep(2)
    for name, extra in trees.items():
        res[name].append(t([sys.executable,"-m","envguard","install","--yes","--python",PY,"--",U,*install], extra)); time.sleep(2)
        res[f"snapshot after {name}"].append(t([sys.executable,"-m","envguard","snapshot","--python",PY,"-o","/dev/null"], extra))
        t(reset); time.sleep(2)
for k,v in res.items(): print(f"{k:28s} median {statistics.median(v):.2f} s", [round(x,2) for x in v])
