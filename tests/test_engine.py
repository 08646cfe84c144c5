"""The DeepSpeed engine as rl/engine.py builds it for one process."""
import pytest
import torch

from conftest import TINY


def _build(tmp_path, *overrides):
    from rl.configure import load_config
    from rl.engine import build_engine
    from student import ByteTokenizer, build_student

    cfg = load_config("experiments/default", TINY + [f"output_dir={tmp_path}", "deepspeed.gradient_clipping=0.5",
                                                     "deepspeed.gradient_accumulation_steps=2", *overrides])
    torch.manual_seed(0)
    return build_engine(lambda: build_student(cfg.student, ByteTokenizer()), cfg)[0]


def _ids():
    return torch.randint(3, 200, (4, 12), generator=torch.Generator().manual_seed(0))


def _engine_forward(engine, half):
    return engine(input_ids=half, labels=half).loss


def _two_steps(engine, ids, loss_of=_engine_forward):
    """Two optimizer steps of two accumulated micro-batches each; the parameters after them."""
    for _ in range(2):
        for half in ids.chunk(2):
            loss = loss_of(engine, half)
            engine.backward(loss)
            engine.step()
    return [p.detach().clone() for p in engine.module.parameters()]


def test_one_rank_skips_the_gradient_reduction_and_updates_the_same(tmp_path):
    ids = _ids()
    skipping = _build(tmp_path)                              # one rank: build_engine skips the reduction
    reducing = _build(tmp_path)
    reducing.enable_backward_allreduce = True                # DeepSpeed's own path, for reference
    after_skipping, after_reducing = _two_steps(skipping, ids), _two_steps(reducing, ids)
    before = [p.detach() for p in _build(tmp_path).module.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(after_skipping, before))     # it did train
    assert all(torch.equal(a, b) for a, b in zip(after_skipping, after_reducing))


def _outside_forward(engine, half):
    """The module's arithmetic computed outside its own forward, as the lean forward is, through
    call_through (which is how rl/trainer.py runs the lean training forward)."""
    from rl.engine import call_through

    module = engine.module
    return call_through(engine, lambda: type(module).forward(module, input_ids=half, labels=half).loss)


@pytest.mark.parametrize("stage", [0, 2])
def test_call_through_updates_as_the_engines_own_forward(tmp_path, stage):
    ids = _ids()
    own = _two_steps(_build(tmp_path, f"deepspeed.zero_stage={stage}"), ids)
    engine = _build(tmp_path, f"deepspeed.zero_stage={stage}")
    through = _two_steps(engine, ids, _outside_forward)
    assert "forward" not in vars(engine.module)              # the class's forward is back
    before = [p.detach() for p in _build(tmp_path, f"deepspeed.zero_stage={stage}").module.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(through, before))            # it did train
    assert all(torch.equal(a, b) for a, b in zip(through, own))


def test_call_through_gives_zero_its_accumulation_boundary_in_the_backward(tmp_path):
    # What DeepSpeed's forward does that the backward needs (rl/engine.py::call_through): its output
    # hooks hand the ZeRO-2 optimizer the engine's gradient-accumulation boundary before the
    # per-parameter gradient hooks read it. A forward outside engine() leaves last micro-batch's.
    engine = _build(tmp_path, "deepspeed.zero_stage=2")
    module, ids = engine.module, _ids()
    seen = []
    param = next(p for p in module.parameters() if p.requires_grad)
    param.register_hook(lambda g: seen.append(engine.optimizer.is_gradient_accumulation_boundary()))

    def boundaries(loss_of):
        seen.clear()
        expected = []
        for half in ids.chunk(2):
            loss = loss_of(engine, half)
            expected.append(engine.is_gradient_accumulation_boundary())
            engine.backward(loss)
            engine.step()
        return seen[:], expected

    got, expected = boundaries(_outside_forward)
    assert expected == [False, True] and got == expected, (
        f"through call_through the ZeRO-2 gradient hooks saw boundaries {got}, the engine's are {expected}: "
        "DeepSpeed's forward no longer hands them over (see rl/engine.py::call_through)")
    bypassed, expected = boundaries(lambda e, half: type(module).forward(module, input_ids=half, labels=half).loss)
    assert bypassed == [True, False] != expected, (
        f"outside engine() the gradient hooks saw the engine's own boundaries {bypassed}: DeepSpeed no longer "
        "needs its forward for them, and call_through could call fn() directly (see its docstring)")


def test_call_through_refuses_an_engine_that_bypasses_its_module():
    from rl.engine import call_through

    class Bypassing:        # an engine whose forward stopped calling self.module(...)
        module = torch.nn.Linear(2, 2)

        def __call__(self):
            return torch.zeros(())

    engine = Bypassing()
    with pytest.raises(RuntimeError, match="called its module 0 times.*student.lean_forward=false"):
        call_through(engine, lambda: torch.ones(()))
    assert "forward" not in vars(engine.module)
