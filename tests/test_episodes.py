"""Multi-message episodes (rl/episodes.py, rl/environments/): the chat layout of tool calls, replies fed
into the KV cache and masked out of every loss, the calculator's per-step verifier, targeting the
first wrong message, and the one-message case unchanged."""
import random

import pytest
import torch

from rl.config import TaskConfig
from rl.environments import build_environment
from rl.environments.calculator import canonical, terms
from rl.episodes import Episodes, Transcript, hinted_context, message_spans
from rl.hints import hint_failed_attempts
from rl.tasks import Problem, TaskSource
from rl.warmstart import demonstrations
from student import ByteTokenizer, StudentConfig, build_student
from student.hf_policy import HFPolicy
from student.lean_policy import LeanPolicy
from student.policy import Sampling
from student.tokenizer import assistant_message
from teacher import LeakGuard, TeacherConfig, build_teacher

TOK = ByteTokenizer()


def problem(expression="15 - 43 + 7", index=0):
    value, rest = terms(expression)
    return Problem(index, expression, canonical(expression)[-1], {"question": expression, "answer": ""})


@pytest.fixture(scope="module")
def calculator():
    tasks = TaskSource(TaskConfig(name="chain_sum", render="expression", eval_size=4, environment="calculator",
                                  config={"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 2}), seed=0)
    return build_environment("calculator", tasks)


def tiny_model():
    torch.manual_seed(0)
    cfg = StudentConfig(arch="qwen3_moe", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                        num_experts=4, expert_width=16)
    return build_student(cfg, TOK).eval()


# ---------------------------------------------------------------------- layout
def test_an_episode_with_tool_calls_renders_alike_in_the_layout_and_the_exported_template(calculator):
    messages = calculator.demonstration(problem())
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "calc", "arguments": '{"a":15,"op":"-","b":43}'}
    messages.insert(3, {"role": "hint", "content": 'starts with calc{"a":-28'})
    ours = TOK.render_messages(messages)
    theirs = TOK.to_transformers().apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert ours == theirs
    text = TOK.decode([i for i in ours if i < 256])
    assert text == '15 - 43 + 7calc{"a":15,"op":"-","b":43}-28starts with calc{"a":-28calc{"a":-28,"op":"+","b":7}-21-21'
    # and a tool-call message reads back into the chat-completions shape it was rendered from
    assert assistant_message('calc{"a":15,"op":"-","b":43}', "call_0") == messages[1]


# ---------------------------------------------------------------------- the calculator environment
def test_calculator_verifies_the_answer_and_finds_the_first_wrong_step(calculator):
    p = problem()
    good = calculator.demonstration(p)
    verdict = calculator.verify(p, good)
    assert verdict.reward == 1.0 and verdict.first_wrong is None

    # the second call copies the running value wrong: message 3 is the first wrong one
    bad = good[:3] + [assistant_message('calc{"a":-27,"op":"+","b":7}', "call_1"),
                      {"role": "tool", "tool_call_id": "call_1", "content": "-20"},
                      assistant_message("-20")]
    verdict = calculator.verify(p, bad)
    assert verdict.reward == 0.0 and verdict.first_wrong == 3
    assert verdict.expected == 'calc{"a":-28,"op":"+","b":7}' and "[4]" in verdict.feedback

    # right calls, wrong final copy: the answer message is the first wrong one
    wrong_answer = good[:-1] + [assistant_message("-12")]
    verdict = calculator.verify(p, wrong_answer)
    assert (verdict.reward, verdict.first_wrong, verdict.expected) == (0.0, 5, "-21")

    # an answer without any call: right is right, wrong is wrong at the first message
    assert calculator.verify(p, good[:1] + [assistant_message("-21")]).reward == 1.0
    verdict = calculator.verify(p, good[:1] + [assistant_message("-20")])
    assert verdict.first_wrong == 1 and verdict.expected == 'calc{"a":15,"op":"-","b":43}'


def test_a_malformed_tool_call_gets_a_tool_error_and_the_episode_goes_on(calculator):
    p = problem()
    episodes = Episodes(calculator, TOK, [p], max_turns=4, max_new_tokens=40)
    for text, error in [('calc{"a":15,"op":"-"', "not JSON"), ('calc{"a":15,"op":"^","b":43}', "need"),
                        ('sqrt{"x":4}', "unknown tool")]:
        reply = episodes.after_message(0, TOK.render_answer(text), ended=True)
        assert reply is not None and TOK.decode(reply[:-1]).startswith("error:") and error in TOK.decode(reply[:-1])
        assert reply[-1] == TOK.assistant_id
    assert episodes.malformed == 3 and not episodes.truncated[0]
    # the fourth message reaches max_turns while the tool would still answer: a counted truncation
    assert episodes.after_message(0, TOK.render_answer('calc{"a":15,"op":"-","b":43}'), ended=True) is None
    assert episodes.truncated[0] and episodes.stats()["episode/malformed_tool_calls"] == 3.0
    # a message cut at max_new_tokens ends the episode, counted
    cut = Episodes(calculator, TOK, [p], max_turns=4, max_new_tokens=8)
    assert cut.after_message(0, TOK.encode("calc{\"a\""), ended=False) is None and cut.truncated[0]


# ---------------------------------------------------------------------- generation with turns
class Scripted:
    """Turns that answer every message with a fixed reply, `replies` times per row (rows differ)."""

    def __init__(self, n, replies, new):
        self.left = [replies + (i % 2) for i in range(n)]
        self.max_tokens = (replies + 2) * new + (replies + 1) * 3
        self.seen: list[tuple[int, list[int]]] = []

    def after_message(self, row, message, ended):
        self.seen.append((row, message))
        if self.left[row] == 0:
            return None
        self.left[row] -= 1
        return TOK.encode("=7") + [TOK.assistant_id]


def test_replies_are_fed_into_the_cache_masked_and_score_as_sampled():
    """Rows finishing at different turns; replies are never sampled tokens (mask False, log-prob 0);
    one scoring forward over prompt + whole episode, routes replayed, gives the sampling log-probs
    (the KV cache the replies were appended to is the same context); lean and transformers agree."""
    model = tiny_model()
    prompts = [TOK.render_prompt("1 + 2 + 3"), TOK.render_prompt("40 - 2 + 1"), TOK.render_prompt("7 - 1 + 1")]
    rolls = []
    for policy in (LeanPolicy(model, pad_id=TOK.pad_id, banned_ids=TOK.never_sampled),
                   HFPolicy(model, pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)):
        turns = Scripted(len(prompts), replies=1, new=5)
        torch.manual_seed(1)
        roll = policy.generate(prompts, Sampling(5, TOK.eos_id, TOK.pad_id), turns)
        comp, mask = roll.completion_ids_NC, roll.mask_NC
        for i in range(len(prompts)):
            spans = message_spans(mask[i].tolist())
            assert len(spans) == 2 + (i % 2)                 # rows end at different turns
            for (s, e), (row, message) in zip(spans, [m for m in turns.seen if m[0] == i]):
                assert comp[i, s:e].tolist() == message
            for (_, e), (s2, _) in zip(spans, spans[1:]):     # between messages: the reply, not sampled
                assert comp[i, e:s2].tolist() == TOK.encode("=7") + [TOK.assistant_id]
        assert (roll.logprobs_NC[~mask] == 0).all()
        with torch.no_grad():
            scores = policy.score(prompts, comp, routes=roll.routes)
        assert policy.take_replay_mismatch() == 0.0
        torch.testing.assert_close(scores.logprobs_NC[mask], roll.logprobs_NC[mask], atol=1e-4, rtol=1e-4)
        rolls.append(roll)
    lean, hf = rolls
    assert torch.equal(lean.completion_ids_NC, hf.completion_ids_NC) and torch.equal(lean.mask_NC, hf.mask_NC)


def test_the_one_message_case_is_the_plain_rollout(calculator):
    """One-message tasks through the protocol (the `answer` environment): the same tokens, mask and
    log-probs as a generation without turns."""
    tasks = TaskSource(TaskConfig(eval_size=4), seed=0)
    env = build_environment("answer", tasks)
    problems = tasks.next_batch(6)
    model = tiny_model()
    policy = LeanPolicy(model, pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)
    episodes = Episodes(env, TOK, problems, max_turns=1, max_new_tokens=6)
    assert episodes.prompts == [TOK.render_prompt(p.prompt) for p in problems]
    torch.manual_seed(3)
    a = policy.generate(episodes.prompts, Sampling(6, TOK.eos_id, TOK.pad_id), episodes)
    torch.manual_seed(3)
    b = policy.generate(episodes.prompts, Sampling(6, TOK.eos_id, TOK.pad_id))
    for x, y in [(a.completion_ids_NC, b.completion_ids_NC), (a.mask_NC, b.mask_NC), (a.logprobs_NC, b.logprobs_NC)]:
        assert torch.equal(x, y)
    attempts = [TOK.decode(r.tolist()) for r in b.completion_ids_NC]
    assert [t.final_text() for t in episodes.transcripts(a.mask_NC)] == attempts
    assert [(v.reward, v.feedback) for v in episodes.verdicts()] == \
        [(v.reward, v.feedback) for v in (tasks.verify(p, t) for p, t in zip(problems, attempts))]


# ---------------------------------------------------------------------- targeting
def _episode(calculator, p, texts):
    """A hand-built episode: the assistant texts, the calculator's replies between them."""
    episodes = Episodes(calculator, TOK, [p], max_turns=6, max_new_tokens=40)
    completion, mask = [], []
    for text in texts:
        message = TOK.render_answer(text)
        completion += message
        mask += [True] * len(message)
        reply = episodes.after_message(0, message, ended=True)
        if reply:
            completion += reply
            mask += [False] * len(reply)
    return episodes, completion, mask


@pytest.mark.parametrize("wrong_at", [0, 1, 2])
def test_the_rule_teacher_targets_the_first_wrong_message_and_the_hint_goes_right_before_it(calculator, wrong_at):
    p = problem()
    first, second, _ = canonical(p.prompt)
    # after the wrong message, the episode follows what the tool said
    texts = {0: ['calc{"a":15,"op":"+","b":43}', 'calc{"a":58,"op":"+","b":7}', "65"],
             1: [first, 'calc{"a":-28,"op":"+","b":8}', "-20"],
             2: [first, second, "-22"]}[wrong_at]
    episodes, completion, mask = _episode(calculator, p, texts)
    transcript = episodes.transcripts(torch.tensor([mask]))[0]
    verdict = episodes.verdicts()[0]
    target = [1, 3, 5][wrong_at]
    assert verdict.reward == 0.0 and verdict.first_wrong == target
    hinted = hint_failed_attempts(build_teacher(TeacherConfig()), LeakGuard(), TOK, [p], [transcript.final_text()],
                                  [verdict], episodes=[(transcript, completion)])
    assert hinted.rows == [0] and hinted.targets == [target]
    start = transcript.span_of(target)[0]
    assert hinted.starts == [start]
    # everything before the target as sampled, then <hint> hint <assistant>
    context = hinted.prompt_ids[0]
    before = transcript.prompt_ids + completion[:start]
    assert context[:len(before) - 1] == before[:-1] and context[-1] == TOK.assistant_id
    assert TOK.decode(context[len(before):-1]) == hinted.hints[0]
    expected = canonical(p.prompt)[wrong_at]
    kind, _, shown = hinted.hints[0].partition(" with ")
    assert expected.startswith(shown) if kind == "starts" else expected.endswith(shown)


def test_hinted_context_of_a_one_message_episode_is_the_hinted_prompt():
    prompt = TOK.render_prompt("3 + 4")
    transcript = Transcript(prompt, [{"role": "user", "content": "3 + 4"}, {"role": "assistant", "content": "8"}],
                            [(0, 2)])
    assert hinted_context(TOK, transcript, TOK.render_answer("8"), 1, "starts with 7") == \
        (TOK.render_prompt("3 + 4", "starts with 7"), 0)


def test_demonstrations_train_the_assistant_messages_only(calculator):
    problems = [problem("15 - 43 + 7"), problem("4 - 1 - 7", 1)]
    prompts, completions, masks = demonstrations(problems, build_teacher(TeacherConfig()), LeakGuard(), TOK,
                                                 random.Random(0), hint_fraction=1.0, env=calculator)
    for p, prompt, completion, mask in zip(problems, prompts, completions, masks):
        trained = [t for t, m in zip(completion, mask) if m]
        said = [t for t, m in zip(completion, mask) if not m]
        steps = canonical(p.prompt)
        assert TOK.decode([t for t in trained if t != TOK.eos_id]) == "".join(steps)
        assert trained.count(TOK.eos_id) == len(steps)
        assert TOK.hint_id in prompt + said and TOK.assistant_id not in trained


# ---------------------------------------------------------------------- the loss covers the target message
@pytest.mark.parametrize("scope", ["message", "trajectory"])
def test_hint_distill_scores_and_covers_the_target_message_only(calculator, scope):
    """message: the teacher context is the episode before the target with the hint right before it,
    and the divergence covers the target message's tokens; trajectory: the hint before the first
    message, every message the policy wrote."""
    from rl.batch import Batch
    from rl.methods import StepContext
    from rl.methods.hint_distill import HintDistill, HintDistillConfig
    from rl.tasks import Verdict

    p = problem()
    first, _, _ = canonical(p.prompt)
    episodes, completion, mask = _episode(calculator, p, [first, 'calc{"a":-28,"op":"+","b":8}', "-20"])
    transcript = episodes.transcripts(torch.tensor([mask]))[0]
    verdict = episodes.verdicts()[0]
    comp = torch.tensor([completion])
    batch = Batch(problems=[p], prompt_ids=[transcript.prompt_ids], completion_ids_NC=comp,
                  mask_NC=torch.tensor([mask]), old_logprobs_NC=torch.zeros(comp.shape), routes=None,
                  attempts=[transcript.final_text()], verdicts=[verdict], rewards_N=torch.zeros(1),
                  group_N=torch.zeros(1, dtype=torch.long), source=["rollout"], transcripts=[transcript])
    policy = LeanPolicy(tiny_model(), pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)
    ctx = StepContext(policy=policy, teacher_policy=policy, diagnostic=policy, teacher=build_teacher(TeacherConfig()),
                      guard=LeakGuard(), tok=TOK, tasks=None, cfg=type("C", (), {"rollout": type("R", (), {"temperature": 1.0})}),
                      sampling=None, metered=lambda x: x, lap=lambda name: None, env=calculator)
    method = HintDistill(HintDistillConfig(hint_scope=scope, distill_estimator="sampled", distill_span="all"))
    method.extend(batch, ctx)
    target = batch.targets["hinted"]
    assert batch.hinted.targets == [3]
    covered = target.mask_HC[0] & batch.mask_NC[0]
    s, e = transcript.span_of(3)
    if scope == "message":
        assert covered.nonzero().flatten().tolist() == list(range(s, e))
        context = hinted_context(TOK, transcript, completion, 3, batch.hinted.hints[0])[0]
        direct = policy.score([context], comp[:, s:e]).logprobs_NC[0]
        torch.testing.assert_close(target.scores.logprobs_NC[0, s:e], direct)
    else:
        assert torch.equal(covered, batch.mask_NC[0])
        direct = policy.score([TOK.render_prompt(p.prompt, batch.hinted.hints[0])], comp).logprobs_NC[0]
        torch.testing.assert_close(target.scores.logprobs_NC[0], direct)


def test_a_logged_episode_reads_as_a_transcript_with_its_target_highlighted(calculator):
    from rl.analysis import transcript_html

    p = problem()
    first, _, _ = canonical(p.prompt)
    episodes, _, _ = _episode(calculator, p, [first, 'calc{"a":-28,"op":"+","b":8}', "-20"])
    html = transcript_html({"messages": episodes.messages[0], "hint": 'starts with calc{"a":-28,"op":"+","b":7',
                            "hint_target": 3, "reward": 0.0, "feedback": "incorrect"})
    lines = html.split("</div>")
    at = next(i for i, line in enumerate(lines) if "hint: starts with" in line)
    assert "[4] <b>assistant</b>" in lines[at + 1] and "background" in lines[at + 1]
    assert sum("background" in line for line in lines) == 1 and "[3] <b>tool</b>" in lines[at - 1]


def test_every_tool_reply_fits_the_environment_s_reply_budget(calculator):
    """The KV capacity counts on max_reply_tokens: no call, however odd, may get a longer reply."""
    p = problem()
    odd = ['x' * 30 + '{"a":1,"op":"+","b":2}', 'calc{"a":999999999,"op":"*","b":-999999999}',
           'calc{"a":10000000000,"op":"*","b":2}', 'calc{"a":true,"op":"+","b":1}', 'calc{' + '9' * 200,
           'calc{"a":1,"op":"+","b":2,"c":3}']
    for text in odd:
        episodes = Episodes(calculator, TOK, [p], max_turns=3, max_new_tokens=300)
        reply = episodes.after_message(0, TOK.render_answer(text), ended=True)
        assert reply is not None and len(reply) <= calculator.max_reply_tokens, text


# ---------------------------------------------------------------------- the step-by-step chain
def test_the_chain_environment_checks_every_partial_result(calculator):
    chain = build_environment("chain", calculator.tasks)
    p = problem("15 - 43 + 7 - 2")
    good = chain.demonstration(p)
    assert [m.get("content") for m in good] == ["15 - 43 + 7 - 2", "-28", "next", "-21", "next", "-23"]
    assert chain.verify(p, good).reward == 1.0
    bad = good[:3] + [{"role": "assistant", "content": "-20"}, good[4], {"role": "assistant", "content": "-22"}]
    verdict = chain.verify(p, bad)
    assert (verdict.reward, verdict.first_wrong, verdict.expected) == (0.0, 3, "-21")
    # one partial per message, through the protocol: the user says next until every operator is done
    episodes = Episodes(chain, TOK, [p], max_turns=5, max_new_tokens=8)
    replies = [episodes.after_message(0, TOK.render_answer(v), ended=True) for v in ["-28", "-21", "-23"]]
    assert replies[0] == replies[1] == TOK.encode("next") + [TOK.assistant_id] and replies[2] is None
    assert episodes.messages[0] == good and episodes.verdicts()[0].reward == 1.0
    # an episode cut short is wrong at the first missing step
    short = Episodes(chain, TOK, [p], max_turns=2, max_new_tokens=8)
    short.after_message(0, TOK.render_answer("-28"), ended=True)
    assert short.after_message(0, TOK.render_answer("-21"), ended=True) is None and short.truncated[0]
    assert "2 of 3 steps" in short.verdicts()[0].feedback
