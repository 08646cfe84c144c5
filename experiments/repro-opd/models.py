"""The student and the two teachers of this study (and `experiments/teacher`, the same shape as the
teacher): parameters, the warm-start demonstrations each saw per difficulty bucket, and (for this
study's teachers) their final held-out accuracy per bucket.

Parameters: the model each config builds (`student.model.build_student`). Demonstrations: the
warm-start draws `warmstart.steps` batches of `warmstart.batch_size` problems from the task stream
by `warmstart.mix`; which bucket each stream position draws from, and which prompts are skipped
because they are held out, are functions of the seed alone (`rl/tasks.py`), so replaying the
stream here counts exactly what the trainer's warm-start saw (no model is run). Accuracy: the
prepared runs' last evaluation, from `results/summary.json` ("prepared"). Usage (about a minute):

    .venv/bin/python experiments/repro-opd/models.py > experiments/repro-opd/results/models.md
"""
import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# this folder's teacher/ (a config folder) would shadow the project's `teacher` package
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import torch  # noqa: E402

from rl.configure import load_config  # noqa: E402
from rl.tasks import TaskSource  # noqa: E402
from student.model import build_student, count_parameters  # noqa: E402
from student.tokenizer import ByteTokenizer  # noqa: E402

FOLDERS = {"student (every arm; the default student's shape)": HERE, "teacher (`opd`, `opd_pg`)": HERE / "teacher",
           "teacher-easy (`opd_easy_teacher`)": HERE / "teacher-easy",
           "`experiments/teacher` (`teacher-distill`'s teacher; no buckets)": HERE.parent / "teacher"}


def main() -> None:
    prepared = json.loads((HERE / "results" / "summary.json").read_text())["prepared"]
    print("# The student and the teachers of repro-opd\n")
    print("    .venv/bin/python experiments/repro-opd/models.py\n")
    print("| model | config | parameters | hidden / expert width | warm-start steps x batch | "
          "demonstrations seen per bucket (seed) | final held-out accuracy: easy / hard |")
    print("|---|---|---|---|---|---|---|")
    for name, folder in FOLDERS.items():
        cfg = load_config(folder, ["student.experts_implementation=eager"])
        torch.manual_seed(0)
        params = count_parameters(build_student(cfg.student, ByteTokenizer()))
        tasks = TaskSource(cfg.task, cfg.seed, cfg.eval)
        seen = collections.Counter()
        mix = dict(cfg.warmstart.mix) or None
        for _ in range(cfg.warmstart.steps):
            seen.update(p.bucket for p in tasks.next_batch(cfg.warmstart.batch_size, mix))
        acc = prepared.get(cfg.experiment)
        acc_cell = f"{acc['easy']:.3f} / {acc['hard']:.3f} (step {acc['step']})" if acc else "—"
        buckets = ", ".join(f"{b} {seen[b]:,}" for b in tasks.buckets)
        rel = folder.relative_to(HERE.parent.parent)
        print(f"| {name} | `{rel}/config.yaml` | {params:,} | {cfg.student.hidden_size} / {cfg.student.expert_width} | "
              f"{cfg.warmstart.steps} x {cfg.warmstart.batch_size} | {buckets} ({cfg.seed}) | "
              f"{acc_cell} |")


if __name__ == "__main__":
    main()
