import os, time, sys, subprocess, shutil
from pathlib import Path
R="/root/b35-bench"; PY=f"{R}/venv/bin/python"; U="/work/main/.venv/bin/uv"
env={k:v for k,v in os.environ.items() if not k.startswith(("UV_","PIP_")) and k!="VIRTUAL_ENV"}
env.update(UV_OFFLINE="1", UV_NO_CONFIG="1")
K=f"{R}/.venv.envguard-scratch"
def run(prefix):
    s=time.perf_counter(); subprocess.run([U,"pip","install","-q","--python",PY,"--prefix",prefix,"flask","botocore","aiohttp"],env=env,check=True,cwd=R); return time.perf_counter()-s
def snap(d): return set(os.path.relpath(os.path.join(a,n),d) for a,ds,fs in os.walk(d) for n in ds+fs)
base=snap(K)
for i in range(3):
    subprocess.run(["cp","-a",K,f"{R}/.ptest"],check=True); time.sleep(1)
    print("cp-copy", round(run(f"{R}/.ptest"),3)); shutil.rmtree(f"{R}/.ptest"); time.sleep(1)
    print("kept   ", round(run(K),3))
    # restore the kept copy: remove what uv added at top level of new entries
    now=snap(K)
    for rel in sorted(now-base, key=len):
        p=os.path.join(K,rel)
        if os.path.lexists(p):
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
    time.sleep(1)
