"""The methods' own stages on a real single-process trainer (tiny student, DeepSpeed ZeRO-0):
corrected rows, self-distillation contexts, the separate teacher, the self-teacher's weights, and
the compute budget."""
import pytest
import torch

from conftest import TINY


def _trainer(tmp_path, name, *extra):
    from rl.configure import load_config
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer

    cfg = load_config("experiments/default", TINY + [f"output_dir={tmp_path}", f"run_name={name}",
                                                    "warmstart.steps=0", *extra])
    return Trainer(cfg, resolve_run_dir(cfg))


def test_corrected_replay_adds_hint_free_rows_to_their_groups(tmp_path):
    tr = _trainer(tmp_path, "cr", "method.name=corrected_replay", "method.when=failed", "method.place=join",
                  "method.corrections_per_attempt=2", "method.check_routes=true")
    rollout_rows = tr.cfg.rollout.prompts_per_step * tr.cfg.rollout.attempts_per_prompt
    batch, metrics = tr.collect()
    hinted = batch.hinted
    assert hinted.rows, "a fresh student fails: there must be hinted attempts"
    added = [i for i, s in enumerate(batch.source) if s == "corrected"]
    assert added == list(range(rollout_rows, rollout_rows + 2 * len(hinted.rows)))
    assert metrics["corrected/rows"] == len(added)
    assert 0.0 <= metrics["corrected/success_rate"] <= 1.0 and 0.0 <= metrics["corrected/route_mismatch"] <= 1.0
    for k, row in enumerate(added):
        source = hinted.rows[k // 2]
        assert batch.prompt_ids[row] == batch.prompt_ids[source]          # trained without the hint
        assert batch.group_N[row] == batch.group_N[source]
        assert batch.problems[row] is batch.problems[source]
    # advantages over the grown groups: zero mean per group
    for g in batch.group_N.unique():
        assert batch.advantages_N[batch.group_N == g].sum().abs() < 1e-5
    # routes: the hint-free prompt's routes replayed, the completion (sampled under the hint) free
    per_row = batch.routes.per_row()
    p = per_row[0].size(1) - (batch.completion_ids_NC.size(1) - 1)
    for layer in per_row:
        assert (layer[added, p:] == -1).all() and (layer[:rollout_rows, :p] >= 0).any()
        assert torch.equal(layer[added, :p], layer[[hinted.rows[k // 2] for k in range(len(added))], :p])
    # their old log-probs are the hinted sampling distribution's: finite on real tokens
    assert torch.isfinite(batch.old_logprobs_NC[added][batch.mask_NC[added]]).all()
    out = tr.update(batch)
    assert "corrected/is_ratio_mean" in out and "loss/pg_corrected" in out
    assert out["router/replay_mismatch"] < 0.05        # free tokens are not counted as forced


@pytest.mark.parametrize("place", ["replace", "mixin"])
def test_corrected_replay_in_place_keeps_the_batch_size(tmp_path, place):
    """Guide's accounting: a correction takes its attempt's place (mixin: only a successful one),
    so the update trains as many rows as the rollout had; the attempts stay in the step's records."""
    tr = _trainer(tmp_path, place, "method.name=corrected_replay", "method.when=failed", f"method.place={place}")
    rollout_rows = tr.cfg.rollout.prompts_per_step * tr.cfg.rollout.attempts_per_prompt
    batch, metrics = tr.collect()
    hinted = batch.hinted
    added = [i for i, s in enumerate(batch.source) if s == "corrected"]
    assert hinted.rows and len(added) == len(hinted.rows) and batch.n == rollout_rows + len(added)
    succeeded = [batch.verdicts[i].reward >= 1.0 for i in added]
    takes_place = [True] * len(added) if place == "replace" else succeeded
    assert batch.trained_N[added].tolist() == takes_place
    for row, source, took in zip(added, hinted.rows, takes_place):
        assert bool(batch.trained_N[source]) is not took           # the attempt or its correction, not both
    assert int(batch.trained_N.sum()) == rollout_rows and metrics["corrected/replaced"] == sum(takes_place)
    # advantages over each group's trained rows; rows left out get none
    assert (batch.advantages_N[~batch.trained_N] == 0).all()
    for g in batch.group_N.unique():
        assert batch.advantages_N[(batch.group_N == g) & batch.trained_N].sum().abs() < 1e-5
    tr.budget.close_step()                                   # the rollout's counts
    tr.update(batch)
    trained = tr.budget.close_step()["budget/trained_tokens"]
    assert trained == sum(len(batch.prompt_ids[i]) + int(batch.mask_NC[i].sum())
                          for i in range(batch.n) if batch.trained_N[i])


def test_corrected_replay_in_place_needs_one_correction_per_attempt():
    from rl.config import ConfigError
    from rl.configure import load_config

    # in place is the default (Guide's): the error says which key lets several corrections in
    with pytest.raises(ConfigError, match="corrections_per_attempt=2 must be 1, or set method.place=join"):
        load_config("experiments/default", ["method.name=corrected_replay", "method.corrections_per_attempt=2"])
    cfg = load_config("experiments/default", ["method.name=corrected_replay", "method.place=join",
                                              "method.corrections_per_attempt=2"])
    assert cfg.method.place == "join" and cfg.method.corrections_per_attempt == 2


def test_corrected_replay_all_fail_only_asks_about_groups_without_a_success(tmp_path):
    from rl.methods.corrected_replay import candidates

    tr = _trainer(tmp_path, "cand", "method.name=corrected_replay")
    batch, _ = tr.collect()
    batch.verdicts[0].reward = 1.0                      # group 0 now has a success
    g = tr.cfg.rollout.attempts_per_prompt
    assert candidates(batch, "all_fail") == [i for i in range(g, batch.n) if batch.source[i] == "rollout"
                                             and batch.verdicts[i].reward < 1.0]
    assert candidates(batch, "failed")[0] == 1


def test_self_distill_context():
    from rl.methods.self_distill import teacher_context
    from rl.tasks import Verdict

    verdicts = [Verdict(0.0, "incorrect: '4' does not match"), Verdict(1.0, "correct"), Verdict(0.0, "no answer")]
    attempts = ["4", " 7 ", ""]
    assert teacher_context(0, attempts, verdicts, [0, 1, 2], "solution") == "a correct answer: 7"
    assert teacher_context(0, attempts, verdicts, [0, 2], "solution") is None          # no success in the group
    both = teacher_context(2, attempts, verdicts, [0, 1, 2], "solution_and_feedback")
    assert both == "a correct answer: 7; feedback on your answer: no answer"


def test_self_distill_scores_failed_rows_in_the_feedback_context(tmp_path):
    tr = _trainer(tmp_path, "sd", "method.name=self_distill", "method.context=feedback",
                  "method.teacher_weights=frozen")
    batch, metrics = tr.collect()
    target = batch.targets["self"]
    failed = [i for i, v in enumerate(batch.verdicts) if v.reward < 1.0]
    assert target.rows == failed and metrics["self/context_rate"] == 1.0
    assert target.scores.topk_ids_NCK.shape[-1] == tr.cfg.method.distill_top_k
    out = tr.update(batch)
    assert out["self/kl_per_token"] >= 0 and out["loss/pg"] == 0.0      # SDPO: distillation alone


def test_self_distill_shuffled_context_comes_from_another_problem(tmp_path, monkeypatch):
    import rl.methods.self_distill as sd

    seen = {}
    real = sd.score_teacher
    monkeypatch.setattr(sd, "score_teacher", lambda policy, cfg, prompts, *a: seen.setdefault("p", prompts) and real(
        policy, cfg, prompts, *a))
    tr = _trainer(tmp_path, "sds", "method.name=self_distill", "method.context=feedback",
                  "method.shuffle_context=true", "method.teacher_weights=frozen")
    batch, _ = tr.collect()
    rows = batch.targets["self"].rows
    assert rows and len(seen["p"]) == len(rows)
    for i, prompt in zip(rows, seen["p"]):
        context = tr.tok.decode(prompt[prompt.index(tr.tok.hint_id) + 1:-1])
        own = f"feedback on your answer: {batch.verdicts[i].feedback}"
        others = {f"feedback on your answer: {batch.verdicts[j].feedback}" for j in range(batch.n)
                  if batch.problems[j].prompt != batch.problems[i].prompt}
        assert context in others and (context != own or own in others)


def test_teacher_distill_scores_every_row_with_the_separate_teacher(tmp_path, exported_teacher):
    tr = _trainer(tmp_path, "td", "method.name=teacher_distill", f"method.teacher_path={exported_teacher}")
    batch, _ = tr.collect()
    target = batch.targets["teacher"]
    assert target.rows == list(range(batch.n))
    # the teacher is the exported model, not the student: its log-probs of the student's tokens differ
    assert not torch.allclose(target.scores.logprobs_NC[batch.mask_NC], batch.old_logprobs_NC[batch.mask_NC])
    budget = tr.budget.close_step()
    tokens = sum(map(len, batch.prompt_ids)) + int(batch.mask_NC.sum())
    assert budget["budget/scored_tokens"] == tokens and budget["budget/generated_tokens"] == batch.mask_NC.sum()


def test_teacher_with_another_vocabulary_is_refused(tmp_path, exported_teacher):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(exported_teacher)
    config.vocab_size += 1
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "other")
    tr = _trainer(tmp_path, "vocab", "method.name=teacher_distill", f"method.teacher_path={tmp_path / 'other'}")
    with pytest.raises(ValueError, match="the teacher's vocabulary has 262 tokens, the student's 261"):
        tr.collect()


@pytest.mark.parametrize("mode", ["ema", "frozen"])
def test_self_teacher_weights_follow_their_rule(tmp_path, mode):
    """ema: θ_T = (1 - r) θ_T + r θ after every RL update, from the student's weights when RL begins;
    frozen: those weights, unchanged; both differ from the live student after an update."""
    rate = 0.25
    tr = _trainer(tmp_path, mode, "method.name=hint_distill", f"method.teacher_weights={mode}",
                  f"method.ema_rate={rate}", "trainer.lr=1e-2")
    start = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.rl_step()
    after_one = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.rl_step()
    teacher = dict(tr.teacher_weights.module.named_parameters())
    moved = max((after_one[n] - start[n]).abs().max().item() for n in start)
    assert moved > 1e-4
    for n, t in teacher.items():
        if mode == "frozen":
            expected = start[n]
        else:
            expected = torch.lerp(torch.lerp(start[n], after_one[n], rate), dict(tr.model.named_parameters())[n], rate)
        torch.testing.assert_close(t, expected, rtol=0, atol=1e-7, msg=n)
    assert tr.teacher_weights.policy() is not tr.policy


def test_eval_reports_the_self_teachers_accuracy_with_the_hint(tmp_path):
    tr = _trainer(tmp_path, "ev", "method.name=hint_distill", "method.teacher_weights=frozen")
    live = tr.evaluate()
    assert live["eval/accuracy_with_hint"] == live["eval/accuracy_hinted"]    # teacher = student before RL
    tr.rl_step()
    ev = tr.evaluate()
    assert ev["eval/teacher_gap"] == pytest.approx(ev["eval/accuracy_with_hint"] - ev["eval/accuracy"])


def test_budget_counts_generated_scored_and_trained_tokens(tmp_path):
    tr = _trainer(tmp_path, "budget", "method.name=hint_distill")
    batch, _ = tr.collect()
    tr.update(batch)
    counts = tr.budget.close_step()
    hinted = batch.hinted
    assert counts["budget/generated_tokens"] == batch.mask_NC.sum()
    assert counts["budget/scored_tokens"] == (sum(map(len, hinted.prompt_ids))
                                              + int(batch.mask_NC[hinted.rows].sum()))
    assert counts["budget/trained_tokens"] == sum(map(len, batch.prompt_ids)) + int(batch.mask_NC.sum())
    again = tr.budget.close_step()
    assert again["budget/generated_tokens"] == 0
    assert again["budget/generated_tokens_total"] == counts["budget/generated_tokens_total"] > 0
