import pytest

from rl.config import TaskConfig
from rl.tasks import TaskSource, render_prompt

SMALL_SPACE = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+", "-"],
                   allow_parentheses=False, allow_negation=False)


def test_train_stream_never_yields_held_out_problems():
    # One-digit two-term problems: only 200 distinct prompts, so seeds alone would collide a lot.
    tasks = TaskSource(TaskConfig(config=SMALL_SPACE, render="expression", eval_size=50), seed=0)
    held_out = {p.prompt for p in tasks.eval_problems}
    train = tasks.next_batch(2000)
    assert tasks.skipped > 0, "the test needs collisions to mean anything"
    assert not held_out & {p.prompt for p in train}
    tasks.assert_disjoint(train)
    with pytest.raises(AssertionError, match="held-out"):
        tasks.assert_disjoint(tasks.eval_problems[:1])


def test_cursor_makes_the_stream_resumable():
    a = TaskSource(TaskConfig(config=SMALL_SPACE), seed=1)
    first = a.next_batch(30)
    b = TaskSource(TaskConfig(config=SMALL_SPACE), seed=1)
    b.cursor = a.cursor
    assert [p.prompt for p in a.next_batch(5)] == [p.prompt for p in b.next_batch(5)]
    assert len(first) == 30


def test_verifier_scores_and_feedback_never_state_the_answer():
    tasks = TaskSource(TaskConfig(config=SMALL_SPACE, render="expression"), seed=0)
    p = tasks.next_batch(1)[0]
    assert tasks.verify(p, p.answer).reward == 1.0
    wrong = tasks.verify(p, p.answer + "9")
    assert wrong.reward < 1.0 and p.answer + "9" in wrong.feedback
    assert f"'{p.answer}'" not in wrong.feedback
    assert tasks.verify(p, "  ").feedback == "no answer was given"


def test_other_reasoning_gym_tasks_work_by_name():
    tasks = TaskSource(TaskConfig(name="leg_counting", eval_size=3), seed=0)
    p = tasks.next_batch(1)[0]
    assert tasks.verify(p, p.answer).reward == 1.0
    with pytest.raises(ValueError, match="task.render=question"):
        render_prompt({"question": "q", "metadata": {"source_dataset": "x"}}, "expression")


def test_binary_reward_pays_only_fully_correct_answers():
    """reasoning-gym gives an attempt that contains the answer partial credit (0.75 for -280
    against -28); binary (the default) pays it nothing, partial keeps the verifier's score."""
    binary = TaskSource(TaskConfig(config=SMALL_SPACE, render="expression"), seed=0)
    partial = TaskSource(TaskConfig(config=SMALL_SPACE, render="expression", reward="partial"), seed=0)
    p = binary.next_batch(1)[0]
    contains = p.answer + "0"
    assert 0.0 < partial.verify(p, contains).reward < 1.0
    assert binary.verify(p, contains).reward == 0.0
    assert binary.verify(p, p.answer).reward == partial.verify(p, p.answer).reward == 1.0
