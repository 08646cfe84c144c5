import pytest

from teacher import HintRequest, LeakGuard, TeacherConfig, build_teacher, leaks_answer
from teacher.rule import targeted_hint


@pytest.mark.parametrize("attempt, answer, hint", [
    ("57", "47", "starts with 4"),        # first digit wrong: give the correct first digit
    ("-15", "-125", "starts with -12"),   # correct prefix through the first wrong character
    ("-42", "-47", "ends with 7"),        # the prefix would be the whole answer: last char instead
    ("4", "47", "ends with 7"),           # too short
    ("470", "47", "ends after 7"),        # too long
    ("12", "-12", "starts with -"),
    ("47", "47", None),                   # nothing to say about a correct attempt
])
def test_rule_hint_targets_first_mistake(attempt, answer, hint):
    assert targeted_hint(attempt, answer) == hint


@pytest.mark.parametrize("hint, answer", [
    ("the answer is 47", "47"), ("47.0", "47"), ("it is -12", "-12"), ("minus 12", "-12"),
    ("negative 12", "-12"), ("ends with 5", "5"), ("try 3/4", "0.75"), ("Paris", "paris"),
    ("it's  New   York", "new york"),
])
def test_leaks_are_caught(hint, answer):
    assert leaks_answer(hint, answer)


@pytest.mark.parametrize("hint, answer", [
    ("starts with 4", "47"), ("147 is close", "47"), ("ends with 7", "-47"), ("12 is positive", "-12"),
    ("4.7", "47"), ("starts with -", "-12"), ("Parisian", "paris"), ("York", "new york"),
])
def test_near_misses_are_kept(hint, answer):
    assert not leaks_answer(hint, answer)


def test_guard_counts_written_and_dropped():
    guard = LeakGuard()
    assert guard.filter("ends with 5", "5") is None
    assert guard.filter("starts with 4", "47") == "starts with 4"
    assert guard.filter(None, "47") is None          # no hint: not counted as written
    assert guard.take_counts() == (2, 1)
    assert guard.take_counts() == (0, 0)


def test_rule_teacher_protocol_targets_the_assistant_message():
    teacher = build_teacher(TeacherConfig(kind="rule"))
    messages = [{"role": "user", "content": "3 + 44"}, {"role": "assistant", "content": "37"}]
    correct = [{"role": "user", "content": "1 + 1"}, {"role": "assistant", "content": "2"}]
    hints = teacher.write_hints([HintRequest(messages, "incorrect", "47"),
                                 HintRequest(correct, "correct", "2")])
    assert hints[0].target_index == 1 and hints[0].text == "starts with 4"
    assert hints[1] is None


def test_unknown_teacher_kind_lists_choices():
    with pytest.raises(ValueError, match="rule"):
        build_teacher(TeacherConfig(kind="oracle"))
