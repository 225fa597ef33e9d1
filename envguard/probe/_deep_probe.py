"""Facts that need ``import torch``; run by ``envguard snapshot --deep`` in a subprocess.

Like ``_inprocess.py`` this runs under the *target* interpreter as a plain script,
stdlib plus torch only. A segfault or hang here kills only this process; the
parent records the failure and the snapshot still completes. Prints one JSON line.
"""

import json
import os
import sys
import time


def main():
    started = time.perf_counter()
    out = {"ok": True}
    import torch

    out["torch_version"] = str(torch.__version__)
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["device_count"] = int(torch.cuda.device_count()) if out["cuda_available"] else 0
        caps = []
        for i in range(out["device_count"]):
            major, minor = torch.cuda.get_device_capability(i)
            caps.append("%d.%d" % (major, minor))
        out["device_capability"] = caps
    except Exception as exc:  # noqa: BLE001 - record, never fail the probe
        out["error"] = "cuda query failed: %s" % exc
    try:
        version = torch.backends.cudnn.version()
        out["cudnn_version"] = None if version is None else str(version)
    except Exception:  # noqa: BLE001
        out["cudnn_version"] = None
    try:
        nccl = torch.cuda.nccl.version() if out.get("cuda_available") else None
        out["nccl_version"] = None if nccl is None else ".".join(str(p) for p in nccl)
    except Exception:  # noqa: BLE001
        out["nccl_version"] = None
    try:
        out["config"] = torch.__config__.show()
    except Exception as exc:  # noqa: BLE001
        out["config"] = "unavailable: %s" % exc
    try:
        from torch._inductor.codecache import torch_key

        out["torch_key"] = torch_key().hex()
    except Exception:  # noqa: BLE001 - private API; absent in some builds
        out["torch_key"] = None
    out["seconds"] = round(time.perf_counter() - started, 3)
    return out


if __name__ == "__main__":
    # Drop this script's folder (envguard/probe) from the path, but only that: under
    # ``python -P`` or PYTHONSAFEPATH sys.path[0] is a real entry of the environment.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)
    print(json.dumps(main()))
