"""Export: a trained run's checkpoint reloads in plain transformers with the same logits, and its
tokenizer is the byte tokenizer with the chat layout."""
import torch

from conftest import TINY
from student.tokenizer import ByteTokenizer


def test_byte_tokenizer_as_transformers_tokenizer():
    tok = ByteTokenizer()
    hf = tok.to_transformers()
    for text in ["3 + 4 = ?", "héllo wörld ✓", "  two  spaces\n", "a<b>c"]:
        assert hf.encode(text, add_special_tokens=False) == tok.encode(text)
        assert hf.decode(tok.encode(text)) == text
    chat = hf.apply_chat_template([{"role": "user", "content": "7-2"},
                                   {"role": "hint", "content": "starts with 5"}],
                                  add_generation_prompt=True, tokenize=True, return_dict=True)
    assert chat["input_ids"] == tok.render_prompt("7-2", "starts with 5")
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (tok.pad_id, tok.bos_id, tok.eos_id)


def test_export_reloads_with_the_same_logits(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.configure import load_config
    from rl.export import export
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer

    cfg = load_config("experiments/default", TINY + [f"output_dir={tmp_path / 'runs'}",
                                                     "trainer.steps=1"])
    trainer = Trainer(cfg, resolve_run_dir(cfg))
    trainer.train()                                   # warm-start 3 + RL 1, checkpoint at step 4
    out = export(trainer.run_dir, tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert getattr(reloaded.config, "experts_implementation", None) in (None, "eager", "grouped_mm")
    ids = torch.tensor([ByteTokenizer().render_prompt("3+4")])
    trainer.model.eval()
    with torch.no_grad():
        expected = trainer.model(ids).logits       # our kernels, the trained weights
        got = reloaded(ids).logits                 # transformers' own experts, exported weights
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.encode("3+4", add_special_tokens=False) == ByteTokenizer().encode("3+4")
