"""A/B of one contender's RL step between two source trees: `python benchmarks/ab_step.py TREE INIT_DIR METHOD`
(run with PYTHONPATH=TREE, its kernels built). Prints the median step and stage times over steps 5-20
of the RL benchmark's workload (benchmarks/rl.py), weights loaded from INIT_DIR (save_initial_weights).
"""
import json, os, statistics, sys, tempfile
from pathlib import Path
root, init, method = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, root)
os.chdir(root)
import torch
torch.set_num_threads(2)
from benchmarks.rl import Workload, run_ours
w = Workload()
res = run_ours(method, w, init, Path(tempfile.mkdtemp()), lambda k, s: None)
st = {k: round(statistics.median(v[4:]), 4) for k, v in res["stages"].items() if k.startswith("time/")}
print("AB", root, method, round(statistics.median(res["step_s"][4:]), 4), json.dumps(st))
