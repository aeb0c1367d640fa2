"""Execute notebooks the way a Colab GPU reader would: each alone in an empty folder, xfam_lib importable.

A chapter runs alone in an empty folder (no saved results beside it, as on Colab). An exercise
notebook (a path under exercises/) runs in a copy of its own folder, which holds what the student
gets beside it: the public tests for a student notebook, the wrong answers for a master.

Usage: python run_notebooks.py OUTDIR PARALLEL NOTEBOOK...   (env: XFAM_SIZE_SCALE etc. pass through)
Writes OUTDIR/notebooks.json (status, seconds, device line, error tail per notebook) and the executed
notebooks as OUTDIR/executed.tar.gz.
"""
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

RUNNER = r'''
import sys, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
client = NotebookClient(nb, timeout=int(sys.argv[2]), kernel_name="python3",
                        resources={"metadata": {"path": path.rsplit("/", 1)[0]}})
try:
    client.execute()
    ok = True
except Exception as e:
    ok = False
    print("ERROR", str(e)[-2000:])
nbformat.write(nb, path)
sys.exit(0 if ok else 1)
'''


def run_one(src, work, cell_timeout, total_timeout):
    name = os.path.basename(src)
    label = src.replace("/", "_").replace(".ipynb", "")
    folder = os.path.join(work, label)
    if "exercises" in src.split(os.sep):
        shutil.copytree(os.path.dirname(os.path.abspath(src)), folder)
    else:
        os.makedirs(folder)
        shutil.copy(src, folder)
    dst = os.path.join(folder, name)
    start = time.time()
    for attempt in range(2):
        try:
            p = subprocess.run([sys.executable, "-c", RUNNER, dst, str(cell_timeout)], capture_output=True,
                               text=True, timeout=total_timeout)
            status, tail = ("ok" if p.returncode == 0 else "fail"), (p.stdout + p.stderr)[-2500:]
        except subprocess.TimeoutExpired:
            status, tail = "timeout", ""
        # kernels started side by side can race for a port (zmq: Address already in use) before any
        # cell runs: that is the runner's fault, not the notebook's, so it is started once more
        if not (status == "fail" and "Address already in use" in tail):
            break
        print(f"retry    {src}: its kernel lost a port race at start", flush=True)
    seconds = round(time.time() - start, 1)
    device_line = ""
    try:
        import nbformat
        nb = nbformat.read(dst, as_version=4)
        for cell in nb.cells[:3]:
            for out in cell.get("outputs", []):
                text = out.get("text", "")
                if "device:" in text:
                    device_line = text.strip().splitlines()[-1]
    except Exception:
        pass
    print(f"{status:8} {seconds:7.1f}s {src} {device_line}", flush=True)
    return {"notebook": src, "status": status, "seconds": seconds, "device": device_line,
            "tail": tail if status != "ok" else ""}, dst


def main():
    outdir, parallel, notebooks = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    work = tempfile.mkdtemp(prefix="nbgpu-")
    results, paths = [], []
    with cf.ThreadPoolExecutor(parallel) as pool:
        futures = [pool.submit(run_one, nb, work, 600, int(os.environ.get("NB_TOTAL_TIMEOUT", "420")))
                   for nb in notebooks]
        for f in futures:
            r, p = f.result()
            results.append(r)
            paths.append(p)
    with open(os.path.join(outdir, "notebooks.json"), "w") as f:
        json.dump(results, f, indent=1)
    with tarfile.open(os.path.join(outdir, "executed.tar.gz"), "w:gz") as tar:
        for p in paths:
            if os.path.exists(p):
                tar.add(p, arcname=os.path.relpath(p, work))
    bad = [r["notebook"] for r in results if r["status"] != "ok"]
    print(f"notebooks: {len(results) - len(bad)} ok, {len(bad)} not ok {bad}")


if __name__ == "__main__":
    main()
