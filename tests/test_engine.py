"""The DeepSpeed engine as rl/engine.py builds it for one process."""
import torch

from conftest import TINY


def _two_steps(engine, ids):
    """Two optimizer steps of two accumulated micro-batches each; the parameters after them."""
    for _ in range(2):
        for half in ids.chunk(2):
            loss = engine(input_ids=half, labels=half).loss
            engine.backward(loss)
            engine.step()
    return [p.detach().clone() for p in engine.module.parameters()]


def test_one_rank_skips_the_gradient_reduction_and_updates_the_same(tmp_path):
    from rl.config import load_config
    from rl.engine import build_engine
    from student import ByteTokenizer, build_student

    cfg = load_config("experiments/default", TINY + [f"output_dir={tmp_path}", "deepspeed.gradient_clipping=0.5",
                                                     "deepspeed.gradient_accumulation_steps=2"])
    tok = ByteTokenizer()
    ids = torch.randint(3, 200, (4, 12), generator=torch.Generator().manual_seed(0))

    def engine():
        torch.manual_seed(0)
        return build_engine(lambda: build_student(cfg.student, tok), cfg)[0]

    skipping = engine()
    assert skipping.enable_backward_allreduce is False      # nothing to reduce over one rank
    reducing = engine()
    reducing.enable_backward_allreduce = True                # DeepSpeed's own path, for reference
    after_skipping, after_reducing = _two_steps(skipping, ids), _two_steps(reducing, ids)
    before = [p.detach() for p in engine().module.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(after_skipping, before))     # it did train
    assert all(torch.equal(a, b) for a, b in zip(after_skipping, after_reducing))
