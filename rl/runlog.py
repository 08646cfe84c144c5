"""The run folder: resolved config, TensorBoard events, metrics.jsonl and rollouts.jsonl.

    runs/<experiment>/<run>/config.yaml       the resolved config (what actually ran)
                            events.out.tfevents.*
                            metrics.jsonl     one object per step: {"step": n, "train/...": ...}
                            rollouts.jsonl    sampled attempts with reward, feedback and hint
                            checkpoints/

On resume, lines past the checkpoint's step are dropped first, so the files read as if the run
had never stopped.
"""
from __future__ import annotations

import json
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


def _truncate_jsonl(path: Path, last_step: int) -> None:
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


class RunLogger:
    def __init__(self, run_dir: Path, config_yaml: str, resume_step: int | None = None):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config_yaml)
        self.metrics_path = run_dir / "metrics.jsonl"
        self.rollouts_path = run_dir / "rollouts.jsonl"
        if resume_step is not None:
            _truncate_jsonl(self.metrics_path, resume_step)
            _truncate_jsonl(self.rollouts_path, resume_step)
        self.tb = SummaryWriter(str(run_dir), purge_step=None if resume_step is None else resume_step + 1)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        for key, value in metrics.items():
            self.tb.add_scalar(key, value, step)

    def log_rollouts(self, step: int, records: list[dict]) -> None:
        with self.rollouts_path.open("a") as f:
            for rec in records:
                f.write(json.dumps({"step": step, **rec}) + "\n")

    def close(self) -> None:
        self.tb.flush()
        self.tb.close()
