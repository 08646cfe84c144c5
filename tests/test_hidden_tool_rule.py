"""The multi-message hidden rule (rl/hidden_tool_rule.py on rl/environments/calculator.py): a tool
key every call must carry, refused otherwise, stated by the hint before the first call."""
import copy
import json
import random

import pytest

from conftest import ROOT
from rl.config import ConfigError
from rl.configure import load_config
from rl.environments.base import build_environment
from rl.hidden_rule import convention, hidden_convention
from rl.tasks import TaskSource
from rl.warmstart import demonstrations
from student.tokenizer import ByteTokenizer
from teacher import LeakGuard, TeacherConfig, build_teacher

FOLDER = ROOT / "experiments/hidden-rule-tool"


@pytest.fixture(scope="module")
def world():
    cfg = load_config(FOLDER, ["task.eval_size=20"])
    tasks = TaskSource(cfg.task, seed=0)
    return tasks, build_environment("calculator", tasks)


def _calls(messages):
    return [json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in messages if m.get("tool_calls")]


def _with_keys(messages, key):
    """The episode with every call's key replaced (None: removed)."""
    out = copy.deepcopy(messages)
    for m in out:
        if m.get("tool_calls"):
            args = json.loads(m["tool_calls"][0]["function"]["arguments"])
            args.pop("key", None)
            if key is not None:
                args["key"] = key
            m["tool_calls"][0]["function"]["arguments"] = json.dumps(args)
    return out


def test_every_call_of_a_keyed_problem_carries_the_one_hidden_key(world):
    tasks, env = world
    key = convention(hidden_convention(8, 0), 8)
    for p in tasks.next_batch(30, {"hidden": 1}):
        demo = env.demonstration(p)
        assert p.prompt.endswith(" ?") and env.verify(p, demo).reward == 1.0
        assert [c["key"] for c in _calls(demo)] == [key, key]
    base = tasks.next_batch(1, {"base": 1})[0]
    assert not base.prompt.endswith("?") and all("key" not in c for c in _calls(env.demonstration(base)))
    stated = {p.entry["metadata"]["tool_key"] for p in tasks.next_batch(200, {"stated": 1})}
    assert len(stated) > 100                                           # a key per problem there


def test_the_tool_refuses_another_key_and_the_reward_asks_for_it(world):
    tasks, env = world
    p = tasks.next_batch(1, {"hidden": 1})[0]
    demo = env.demonstration(p)
    right = env.respond(p, demo[:2]).messages[0]["content"]
    for key in (None, "zz", convention(0, 8) if p.entry["metadata"]["tool_key"] != convention(0, 8) else "ab"):
        episode = _with_keys(demo, key)
        assert env.respond(p, episode[:2]).messages[0]["content"] == "error: refused"
        verdict = env.verify(p, episode)                               # the right value, a broken rule: 0
        assert verdict.reward == 0.0 and verdict.first_wrong == 1 and "value is right" in verdict.feedback
        assert verdict.expected == "calc" + demo[1]["tool_calls"][0]["function"]["arguments"]
    assert right != "error: refused"
    # Answering without the tool earns nothing where a key is the rule; on the base bucket it does.
    assert env.verify(p, [demo[0], {"role": "assistant", "content": p.answer}]).reward == 0.0
    base = tasks.next_batch(1, {"base": 1})[0]
    assert env.verify(base, [env.start(base)[0], {"role": "assistant", "content": base.answer}]).reward == 1.0


def test_hints_and_feedback_state_the_key_never_a_number(world):
    tasks, env = world
    p = tasks.next_batch(1, {"hidden": 1})[0]
    key = p.entry["metadata"]["tool_key"]
    hint, = p.entry["metadata"]["hints"]
    decoy, = p.entry["metadata"]["decoy_hints"]
    assert hint.endswith(key) and not decoy.endswith(key) and not any(ch.isdigit() for ch in hint + decoy)
    verdict = env.verify(p, _with_keys(env.demonstration(p), None))
    assert verdict.feedback.endswith(f"the key {key}") and p.answer not in verdict.feedback
    silent = TaskSource(load_config(FOLDER, ["task.eval_size=4", "task.config.hint=none"]).task, seed=0)
    q = silent.next_batch(1, {"hidden": 1})[0]
    words = build_environment("calculator", silent).verify(q, _with_keys(env.demonstration(q), None)).feedback
    assert q.entry["metadata"]["hints"] == [] and "take the key" not in words


def test_warmstart_puts_the_hint_before_the_first_call(world):
    tasks, env = world
    tok = ByteTokenizer()
    problems = tasks.next_batch(40, {"stated": 1})
    prompts, completions, _ = demonstrations(problems, build_teacher(TeacherConfig(kind="dataset")), LeakGuard(), tok,
                                             random.Random(0), 0.0, env, by_bucket={"stated": 1.0})
    for p, prompt, completion in zip(problems, prompts, completions):
        # the hint is context before the first assistant message: in the prompt, before any call
        assert tok.hint_id in prompt and tok.hint_id not in completion
        assert p.entry["metadata"]["tool_key"] in tok.decode(prompt)


def test_the_calculator_reads_this_task_and_names_what_it_reads():
    load_config(FOLDER)
    with pytest.raises(ConfigError, match="reads task.name=chain_sum with task.render=expression or "
                                          "task.name=hidden_tool_rule"):
        load_config(ROOT / "experiments/hidden-rule", ["task.environment=calculator"])
    with pytest.raises(ConfigError, match="rule_bits=17"):
        load_config(FOLDER, ["task.config.rule_bits=17"])
