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


BUCKETS = {"one": {"min_digits": 1, "max_digits": 1}, "three": {"min_digits": 3, "max_digits": 3}}


def test_buckets_have_their_own_held_out_sets_and_training_never_sees_any():
    cfg = TaskConfig(config=SMALL_SPACE, render="expression", eval_size=40, buckets=BUCKETS)
    tasks = TaskSource(cfg, seed=0)
    assert list(tasks.eval_by_bucket) == ["one", "three"]
    assert all(len(tasks.eval_by_bucket[b]) == 40 for b in BUCKETS)
    assert {p.bucket for p in tasks.eval_by_bucket["three"]} == {"three"}
    # reasoning-gym draws each operand from [0, 10^digits]: most have three digits, none more than four
    widths = [len(x) for p in tasks.eval_by_bucket["three"] for x in p.prompt.split()[::2]]
    assert max(widths) <= 4 and sum(w == 3 for w in widths) > 0.8 * len(widths)
    train = tasks.next_batch(3000)
    assert {p.bucket for p in train} == {"one", "three"}
    assert tasks.skipped > 0                      # the one-digit space (200 prompts) collides
    assert not {p.prompt for p in tasks.eval_problems} & {p.prompt for p in train}
    assert all(tasks.verify(p, p.answer).reward == 1.0 for p in train[:50])


def test_mix_weights_choose_buckets_deterministically_from_the_cursor():
    cfg = TaskConfig(config=SMALL_SPACE, render="expression", eval_size=4, buckets=BUCKETS, mix={"three": 1.0})
    tasks = TaskSource(cfg, seed=3)
    assert {p.bucket for p in tasks.next_batch(50)} == {"three"}
    assert {p.bucket for p in tasks.next_batch(50, {"one": 1.0})} == {"one"}
    skewed = [p.bucket for p in tasks.next_batch(2000, {"one": 3.0, "three": 1.0})]
    assert 0.7 < skewed.count("one") / len(skewed) < 0.8
    # Resuming from the cursor alone reproduces the stream, buckets included.
    again = TaskSource(cfg, seed=3)
    again.cursor = tasks.cursor
    assert ([(p.bucket, p.prompt) for p in tasks.next_batch(20, {"one": 1, "three": 1})]
            == [(p.bucket, p.prompt) for p in again.next_batch(20, {"one": 1, "three": 1})])


def test_without_buckets_the_stream_is_the_single_generator_it_always_was():
    import reasoning_gym

    tasks = TaskSource(TaskConfig(config=SMALL_SPACE, render="expression", eval_size=8), seed=2)
    plain = reasoning_gym.create_dataset("basic_arithmetic", seed=2, size=1_000_000, **SMALL_SPACE)
    held = reasoning_gym.create_dataset("basic_arithmetic", seed=1_000_000, size=8, **SMALL_SPACE)
    assert [p.entry["question"] for p in tasks.eval_problems] == [held[i]["question"] for i in range(8)]
    for p in tasks.next_batch(30):
        assert p.bucket == "all" and p.entry["question"] == plain[p.index]["question"]
