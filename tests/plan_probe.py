"""What a real DeepSpeed engine holds on this rank, for tests/test_plan.py: the bytes of every tensor
alive (each storage once, the model's gradients included) after building the engine for the config
given as key=value arguments and taking one step, measured at the end of a second backward (before
its optimizer step: gradients and optimizer state both held), and the most seen inside that
backward (hooks on a few gradients). Writes OUT_DIR/rank<r>.json: {"rank", "held", "in_backward"}.

    python tests/plan_probe.py OUT_DIR key=value ...     (or under torchrun, one file per rank)"""
import gc
import json
import os
import sys
from pathlib import Path

import torch


def live_bytes(extra=()) -> int:
    """Every tensor storage Python can reach, once; `extra` for tensors it cannot (gradients
    live on the C++ side until read)."""
    seen, total = set(), 0
    for obj in [*gc.get_objects(), *extra]:
        if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
            storage = obj.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def main(out_dir: str, overrides: list[str]) -> None:
    from rl.configure import load_config
    from rl.engine import build_engine
    from student.model import build_student, build_tokenizer

    cfg = load_config(None, overrides)
    tok = build_tokenizer(cfg.student)
    gc.collect()
    before = live_bytes()
    engine, _, _ = build_engine(lambda: build_student(cfg.student, tok), cfg)
    params = list(engine.module.parameters())
    ids = torch.randint(0, 200, (2, 8))
    peak = [0]

    def probe(grad):
        gc.collect()
        grads = [p.grad for p in params if p.grad is not None]
        peak[0] = max(peak[0], live_bytes([grad, *grads]) - before)
        return grad

    for i in range(2):
        loss = engine(input_ids=ids).logits.float().logsumexp(-1).mean()
        # a few gradients spread over the model: each look walks every Python object
        hooks = [p.register_hook(probe) for p in params[::max(1, len(params) // 4)] if p.requires_grad] if i == 1 else []
        engine.backward(loss)
        del loss
        for h in hooks:
            h.remove()
        if i == 1:
            gc.collect()
            held = live_bytes([p.grad for p in params if p.grad is not None]) - before
        engine.step()
    rank = int(os.environ.get("RANK", 0))
    # a file per rank: two ranks printing at once can interleave their lines
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"rank": rank, "held": held, "in_backward": peak[0]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
