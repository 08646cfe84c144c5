"""The tables in this folder's README, from the runs' metrics.jsonl:

    .venv/bin/python experiments/llm-teacher/summarize.py [runs/llm-teacher]

Runs are the folders named <teacher>-s<seed> (hf-s0, rule-s1, ...), each resumed from its seed's
warm-start (step 1200). Per run: held-out accuracy (greedy, 200 problems) at every evaluation, the
RL peak and the end; hinted accuracy at the end; the mean hint rate, leak rate and malformed
replies over the RL steps; the median step and teacher time (also over the last 100 steps); the RL phase's wall time (sum of its
step times, evaluations not included). Then the mean and spread (min..max) per teacher, and the
hints' quality read from rollouts.jsonl (the failed attempts logged each step): a hint of the form
"starts with A" / "ends with B" / both is *true* when the reference answer does start (end) so,
*false* otherwise; anything else is "other".
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd

WARMSTART_END = 1200
_CLAIM = re.compile(r"^(?:starts with (\S+?))?(?:\s*and\s*)?(?:ends with (\S+?))?[.,;!]?$")


def hint_quality(run: Path) -> dict:
    """Of the logged failed attempts after warm-start: share without a hint, and of the hints,
    the share whose claim about the answer is true, false, or not of that form."""
    counts = {"none": 0, "true": 0, "false": 0, "other": 0}
    for line in (run / "rollouts.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["step"] <= WARMSTART_END or r["reward"] > 0:
            continue
        hint = (r.get("hint") or "").strip()
        m = _CLAIM.match(hint) if hint else None
        if not hint:
            counts["none"] += 1
        elif m is None or not (m.group(1) or m.group(2)):
            counts["other"] += 1
        else:
            ok = (m.group(1) is None or r["answer"].startswith(m.group(1))) and \
                 (m.group(2) is None or r["answer"].endswith(m.group(2)))
            counts["true" if ok else "false"] += 1
    hints = counts["true"] + counts["false"] + counts["other"]
    return {"failed logged": sum(counts.values()), "no hint": counts["none"] / max(1, sum(counts.values())),
            "hints true": counts["true"] / max(1, hints), "hints false": counts["false"] / max(1, hints),
            "hints other": counts["other"] / max(1, hints)}


def load(run: Path) -> pd.DataFrame:
    return pd.read_json(run / "metrics.jsonl", lines=True).drop_duplicates("step", keep="last").set_index("step")


def summarize(run: Path) -> dict:
    m = load(run)
    rl = m[m.index > WARMSTART_END]
    acc = m["eval/accuracy"].dropna()
    row = {"run": run.name, "teacher": run.name.rsplit("-s", 1)[0], "steps": int(rl.index.max() - WARMSTART_END)}
    row.update({f"acc@{s}": acc.get(s) for s in acc.index if s >= WARMSTART_END})
    row.update({
        "peak (RL)": acc[acc.index > WARMSTART_END].max(), "end": acc.iloc[-1],
        "hinted end": m["eval/accuracy_hinted"].dropna().iloc[-1],
        "hint rate": rl["hint/rate"].mean(), "leak rate": rl["hint/leak_rate"].mean(),
        "malformed/step": rl["hint/malformed"].mean(), "teacher errors": int(rl["hint/teacher_errors"].sum()),
        "median step s": rl["time/step_s"].median(), "median teacher s": rl["time/teacher_s"].median(),
        "median step s (last 100)": rl["time/step_s"].iloc[-100:].median(),
        "RL wall min": rl["time/step_s"].sum() / 60,
    })
    row.update(hint_quality(run))
    return row


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/llm-teacher")
    runs = sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file() and "-s" in p.name
                  and not p.name.startswith("warmstart") and load(p).index.max() > WARMSTART_END)
    table = pd.DataFrame([summarize(r) for r in runs])
    evals = sorted((c for c in table.columns if c.startswith("acc@")), key=lambda c: int(c[4:]))
    first = ["run", "teacher", "steps", *evals]
    table = table[first + [c for c in table.columns if c not in first]]
    pd.set_option("display.width", 250)
    print(table.to_markdown(index=False, floatfmt=".3f"))
    print()
    # Mean (min..max) over seeds: the first RL evaluation over every run, the rest over the runs
    # that ran the whole RL phase.
    full = table[table["steps"] == table["steps"].max()]
    early = ["acc@1200", "acc@1300"]
    late = ["peak (RL)", "end", "hinted end", "hint rate", "hints true", "median step s (last 100)"]
    lines = ["| teacher | seeds (all / whole phase) | " + " | ".join(early + late) + " |",
             "|---|---|" + "---|" * (len(early) + len(late))]

    def cell(values: pd.Series) -> str:
        return f"{values.mean():.3f} ({values.min():.3f}..{values.max():.3f})" if len(values) else "—"

    for teacher, rows in table.groupby("teacher"):
        whole = full[full["teacher"] == teacher]
        lines.append(f"| {teacher} | {len(rows)} / {len(whole)} | " + " | ".join(
            [cell(rows[c].dropna()) for c in early] + [cell(whole[c].dropna()) for c in late]) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
