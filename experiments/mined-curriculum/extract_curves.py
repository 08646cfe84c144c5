"""Held-out and private-set accuracy at every evaluation of the given runs, as JSON (the README's
first-protocol numbers: results/continuation-first-protocol.json).

    python experiments/mined-curriculum/extract_curves.py RUN_DIR... > FILE.json
"""
import json
import sys
from pathlib import Path

curves = {}
for run in map(Path, sys.argv[1:]):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    curves[run.name] = [{"step": r["step"], "accuracy": r["eval/accuracy"],
                         "private_mined": r.get("eval/private/mined/accuracy")} for r in rows if "eval/accuracy" in r]
print(json.dumps(curves, indent=1))
