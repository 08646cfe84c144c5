"""What one corrected trajectory was worth to each corrected-replay arm of the study, from its runs'
metrics: the share of regenerations under the hint that succeeded, the mean gradient weight on
tokens with a positive advantage, and the per-sequence product of the weights over successful
corrections on `hidden` (1 = a supervised example), median over the RL steps that had corrections;
and how many corrected rows there were in all.

    .venv/bin/python experiments/smol-moe/corrections.py [STUDY_OUTPUT_DIR]   # default runs/study
"""
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEYS = ("corrected/success_rate", "corrected/weight_pos_mean", "corrected/seq_weight/hidden")

base = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/study") / "smol-moe"
out = {}
for arm in ("corrected_replay", "replay_sft"):
    rows = [json.loads(line) for line in (base / f"{arm}-s0" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "corrected/rows" in r]
    corrected = [r for r in rl if r["corrected/rows"] > 0]
    out[arm] = {"rl_steps": len(rl), "steps_with_corrections": len(corrected),
                "corrected_rows": sum(r["corrected/rows"] for r in rl),
                **{k: statistics.median(r[k] for r in corrected if k in r) for k in KEYS}}
(HERE / "results" / "corrections.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
