import os, subprocess, sys, time, statistics
U="/work/main/.venv/bin/uv"; ROOT=os.environ.get("B35","/dev/shm/b35"); PY=f"{ROOT}/venv/bin/python"
env={k:v for k,v in os.environ.items() if not k.startswith(("UV_","PIP_")) and k not in ("VIRTUAL_ENV","PYTHONDONTWRITEBYTECODE")}
env.update(UV_OFFLINE="1", UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never", ENVGUARD_CACHE_DIR=f"{ROOT}/envguard-cache", UV_CACHE_DIR=os.environ.get("UVC","/dev/shm/uvc"), PYTHONPATH="/work/main")
install=["pip","install",*os.environ.get("PKGS","diffusers openai pandas scipy sqlalchemy").split()]
reset=[U,"pip","sync","--quiet","--python",PY,"--find-links",f"{ROOT}/wheels",f"{ROOT}/baseline.txt"]
def t(args, extra={}):
    s=time.perf_counter(); p=subprocess.run(args, env={**env, **extra}, capture_output=True, text=True, cwd=ROOT); d=time.perf_counter()-s
    assert p.returncode==0, p.stdout+p.stderr; return d, p
res={}
modes=sys.argv[1].split(","); n=int(sys.argv[2])
for i in range(n):
  for mode in modes:
    if mode=="plain":
        d,_=t([U,*install[:2],"--python",PY,*install[2:]])
    elif mode=="prof":
        d,_=t([sys.executable,"/tmp/profrun.py","install","--yes","--python",PY,"--",U,*install])
    elif mode=="old":
        d,_=t([sys.executable,"-m","envguard","install","--yes","--python",PY,"--",U,*install], {"PYTHONPATH":"/tmp/old35","ENVGUARD_CACHE_DIR":f"{ROOT}/envguard-cache-old"})
    else:
        d,_=t([sys.executable,"-m","envguard","install","--yes","--python",PY,"--",U,*install])
    res.setdefault(mode,[]).append(d); t(reset); time.sleep(float(os.environ.get("PAUSE","0.5")))
for k,v in res.items(): print(k, "median", round(statistics.median(v),3), [round(x,3) for x in v])
