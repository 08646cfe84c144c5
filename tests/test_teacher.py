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


# ------------------------------------------------------------------ math-verify: equivalent expressions
@pytest.mark.parametrize("hint, answer", [
    ("it is 94/2", "47"), ("4.7e1", "47"), ("try $\\frac{94}{2}$", "47"), ("think of 40 + 7", "47"),
    ("50 - 3", "47"), ("\\boxed{47}", "47"), ("(x+1)^2", "x^2+2*x+1"), ("3/4 of it", "0.75"),
])
def test_equivalent_expressions_are_caught(hint, answer):
    assert leaks_answer(hint, answer)


@pytest.mark.parametrize("hint, answer, problem", [
    ("9 + 8 needs a carry", "17", "9 + 8"),      # restating the problem says nothing new
    ("the sum is 40 + 8", "47", None), ("half of 94", "47", None), ("x^2 + 1", "x^2+2*x+1", None),
    ("look at 0 + 7 first", "47", "40 + 7"), ("a + b", "47", None), ("$\\frac{94}{3}$", "47", None),
])
def test_expression_near_misses_are_kept(hint, answer, problem):
    assert not leaks_answer(hint, answer, problem)


@pytest.mark.parametrize("hint", ["starts with -4", "ends with 7", "ends after 7", "starts with -"])
def test_rule_hints_hold_no_expression_spans(hint):
    """Rule hints skip math-verify entirely (it costs ~10-500 ms per span): no word tail is a variable."""
    from teacher.leak import _math_spans
    assert _math_spans(hint) == []


# ------------------------------------------------------------------ prompt template and reply parsing
from teacher.prompt import PromptTemplate, parse_reply  # noqa: E402

TWO_TURNS = HintRequest([{"role": "user", "content": "3 + 44"}, {"role": "assistant", "content": "37"},
                         {"role": "user", "content": "check it"}, {"role": "assistant", "content": "57"}],
                        "incorrect", "47")
ONE_TURN = HintRequest(TWO_TURNS.messages[:2], "incorrect", "47")


def test_template_renders_roles_numbered_messages_and_targets():
    tpl = PromptTemplate("### system\nBe brief.\n### user\nProblem: {problem}\n{messages}\n"
                         "Feedback: {feedback}\nTargets: {targets}\nLast: {attempt} \\frac{1}{2}")
    chat = tpl.render(TWO_TURNS)
    assert [m["role"] for m in chat] == ["system", "user"]
    assert chat[1]["content"] == ("Problem: 3 + 44\n[1] user: 3 + 44\n[2] assistant: 37\n[3] user: check it\n"
                                  "[4] assistant: 57\nFeedback: incorrect\nTargets: 2, 4\nLast: 57 \\frac{1}{2}")
    assert PromptTemplate("Fix: {attempt}").render(ONE_TURN) == [{"role": "user", "content": "Fix: 37"}]


def test_template_rejects_unknown_placeholders_and_missing_attempt():
    with pytest.raises(ValueError, match="problme"):
        PromptTemplate("{problme} {attempt}")
    with pytest.raises(ValueError, match="attempt"):
        PromptTemplate("{problem} only")
    PromptTemplate.load(None)                            # the packaged default is valid


@pytest.mark.parametrize("reply, req, target, text", [
    ("MESSAGE: 4\nHINT: redo the tens", TWO_TURNS, 3, "redo the tens"),
    ("**Message** #2\n**Hint:** the tens digit", TWO_TURNS, 1, "the tens digit"),
    ('{"message": 4, "hint": "carry the one"}', TWO_TURNS, 3, "carry the one"),
    ("HINT: the tens digit", ONE_TURN, 1, "the tens digit"),        # one target: MESSAGE optional
    ("Sure! hint = 'add the tens first'", ONE_TURN, 1, "add the tens first"),
])
def test_reply_parsing(reply, req, target, text):
    hint = parse_reply(reply, req, max_chars=80)
    assert (hint.target_index, hint.text, hint.error, hint.reply) == (target, text, "", reply)


@pytest.mark.parametrize("reply, req", [
    ("HINT: the tens digit", TWO_TURNS),                 # two targets, none named
    ("MESSAGE: 3\nHINT: the tens digit", TWO_TURNS),     # message 3 is the user's
    ("MESSAGE: 9\nHINT: the tens digit", TWO_TURNS),     # no such message
    ("MESSAGE: 2\nThe answer is 47.", ONE_TURN),         # no hint line
    ("MESSAGE: 2\nHINT:", ONE_TURN),                     # empty hint
    ("", ONE_TURN),
])
def test_malformed_replies_give_no_hint_and_keep_the_reply(reply, req):
    hint = parse_reply(reply, req, max_chars=80)
    assert (hint.target_index, hint.text, hint.error, hint.reply) == (-1, "", "malformed", reply)


def test_hint_is_cut_to_max_chars():
    assert parse_reply("HINT: " + "x" * 100, ONE_TURN, max_chars=10).text == "x" * 10


def test_template_path_is_resolved_against_the_experiment_folder(tmp_path):
    from rl.config import ConfigError
    from rl.configure import load_config
    (tmp_path / "config.yaml").write_text("teacher:\n  prompt_template: prompt.txt\n")
    with pytest.raises(ConfigError, match="teacher.prompt_template"):
        load_config(tmp_path)                            # the file is missing
    (tmp_path / "prompt.txt").write_text("Fix {attempt}")
    cfg = load_config(tmp_path)
    assert cfg.teacher.prompt_template == str((tmp_path / "prompt.txt").resolve())
    (tmp_path / "prompt.txt").write_text("Fix {atempt}")
    with pytest.raises(ConfigError, match="atempt"):
        load_config(tmp_path)


def test_shuffled_teacher_gives_each_attempt_another_problems_hint():
    def request(problem, attempt, answer):
        return HintRequest([{"role": "user", "content": problem}, {"role": "assistant", "content": attempt}],
                           "incorrect", answer)

    requests = [request("12 + 30", "41", "42"), request("12 + 30", "52", "42"),
                request("50 + 21", "61", "71"), request("90 - 5", "85", "85"), request("7 + 70", "70", "77")]
    own = build_teacher(TeacherConfig()).write_hints(requests)
    shuffled = build_teacher(TeacherConfig(shuffle=True)).write_hints(requests)
    own_text = {r.messages[0]["content"]: set() for r in requests}
    for r, h in zip(requests, own):
        if h is not None:
            own_text[r.messages[0]["content"]].add(h.text)
    assert [h.text if h else None for h in own] == ["ends with 2", "starts with 4", "starts with 7", None, "ends with 7"]
    for r, h in zip(requests, shuffled):
        assert h is not None and h.target_index == 1
        # a real hint, written for a different problem
        assert h.text in {t for p, ts in own_text.items() if p != r.messages[0]["content"] for t in ts}
    assert shuffled[0].text == "starts with 7"         # the next request about another problem
    assert build_teacher(TeacherConfig(shuffle=True)).write_hints(requests[:2]) == [None, None]   # one problem only


@pytest.mark.parametrize("attempt, answer, hint", [
    ("1111", "1047", "starts with 104"), ("", "-12", "starts with -1"), ("3", "7", None), ("47", "47", None)])
def test_questa_style_hint_reveals_all_but_the_last_character(attempt, answer, hint):
    assert targeted_hint(attempt, answer, reveal="all_but_last") == hint
    teacher = build_teacher(TeacherConfig(reveal="all_but_last"))
    req = HintRequest([{"role": "user", "content": "q"}, {"role": "assistant", "content": attempt}], "incorrect", answer)
    written = teacher.write_hints([req])[0]
    assert (written.text if written else None) == hint


def test_warmstart_teacher_writes_warmstart_hints_and_the_run_teacher_the_rl_ones(tmp_path):
    """warmstart.teacher=rule with a model teacher for RL: warm-start's demonstrations never reach
    the model teacher (here an OpenAI endpoint that refuses connections), RL's requests do."""
    from conftest import TINY
    from rl.configure import load_config
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer
    from teacher.openai_api import OpenAITeacher
    from teacher.rule import RuleTeacher

    cfg = load_config("experiments/default", TINY + [
        f"output_dir={tmp_path}", "teacher.kind=openai", "teacher.base_url=http://127.0.0.1:9/v1",
        "teacher.model=m", "teacher.retries=0", "warmstart.teacher=rule", "warmstart.hint_fraction=1.0"])
    trainer = Trainer(cfg, resolve_run_dir(cfg))
    assert isinstance(trainer.warmstart_teacher, RuleTeacher) and isinstance(trainer.teacher, OpenAITeacher)
    asked = {"rule": 0, "openai": 0}
    for name, teacher in (("rule", trainer.warmstart_teacher), ("openai", trainer.teacher)):
        write = teacher.write_hints
        teacher.write_hints = lambda reqs, write=write, name=name: (asked.__setitem__(name, asked[name] + len(reqs)),
                                                                    write(reqs))[1]
    trainer.warmstart_step()
    assert asked == {"rule": cfg.warmstart.batch_size, "openai": 0}
    trainer.step = cfg.warmstart.steps
    trainer.rl_step()
    assert asked["openai"] > 0 and asked["rule"] == cfg.warmstart.batch_size
