import os, subprocess, sys, time, statistics
U="/work/main/.venv/bin/uv"; PY="/root/b35-cuda/venv/bin/python"
env={k:v for k,v in os.environ.items() if not k.startswith(("UV_","PIP_")) and k!="VIRTUAL_ENV"}
env.update(UV_OFFLINE="1", UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never", ENVGUARD_CACHE_DIR="/root/b35-cuda/envguard-cache")
def t(args, extra={}):
    s=time.perf_counter(); p=subprocess.run(args, env={**env, **extra}, capture_output=True, text=True); d=time.perf_counter()-s
    assert p.returncode==0, p.stdout+p.stderr; return d
cmd=["pip","install","--reinstall-package","torch","torch"]
res={"plain":[], "new":[], "old":[]}
for i in range(5):
    res["plain"].append(t([U,*cmd[:2],"--python",PY,*cmd[2:]]))
    res["new"].append(t([sys.executable,"-m","envguard","install","--yes","--python",PY,"--",U,*cmd]))
    res["old"].append(t([sys.executable,"-m","envguard","install","--yes","--python",PY,"--",U,*cmd], {"PYTHONPATH":"/tmp/old-8362713"}))
for k,v in res.items(): print(k, round(statistics.median(v),2), [round(x,2) for x in v])
