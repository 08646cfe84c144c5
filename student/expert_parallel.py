"""Expert parallelism (EP) for the transformers MoE student, on our kernels and DeepSpeed's MoE groups.

With `ep_size` ranks per EP group, each rank keeps E/ep_size experts of every MoE layer (a
contiguous slice of the stacked HF expert tensors) and every other parameter whole. The router
stays replicated, so router replay (student.router_replay) and our gating are untouched; only
the experts' forward changes. Per layer, with legend T tokens, K slots, E experts, El = E/ep
local experts, P = T*K routed rows, R rows received from the group:

  1. counts_E, offsets = ops.expert_counts(ids_TK); xs_PD = ops.permute(x_TD, ids_TK): rows sorted
     by global expert, so the rows for rank r's experts are one contiguous block;
  2. all-to-all of the per-expert counts, then of the rows (torch.distributed.nn's autograd
     all_to_all_single: its backward is the reverse all-to-all);
  3. received rows arrive grouped by source rank; ops.permute (top-1 on the local expert id)
     regroups them by local expert, student.experts.expert_mlp runs the grouped GEMMs on the local
     weights, ops.unpermute_combine (weight 1) restores source order;
  4. the reverse all-to-all brings each row home; ops.unpermute_combine sums the K slots.

DeepSpeed sees the experts as expert parameters: the experts module is made an instance of
`deepspeed.moe.layer.MoE` (a subclass of its own class and MoE; MoE's constructor is not run),
which turns on the engine's MoE path, and the expert tensors carry `allreduce=False` and
`group_name="ep_size_N"`, DeepSpeed's names for "reduce over the expert-data-parallel group".
Gradient scaling needs nothing of ours: the all-to-all backward SUMS the contributions of every
rank's tokens into an expert's gradient, and DeepSpeed (ZeRO 1 and 2, and 0) divides expert
gradients by the whole data-parallel world size before summing them over the expert-data-parallel
group, so an expert's gradient is (1/world) * sum over all ranks' losses: what EP=1 computes.

API (call after the process group exists, before deepspeed.initialize; ep_size=1 changes nothing):

    shard_experts(model, ep_size, zero_stage)  # keep this rank's experts (ZeRO 1-2, else ValueError)
    optimizer_param_groups(model)            # param groups for torch.optim.*: dense + one per EP group
    gather_full_state_dict(model)            # collective: the full HF state dict, every expert
    copy_full_weights(model, full_model)     # collective: refresh an unsharded copy (rollouts, eval)
    save_expert_shard(model, tag_dir)        # after engine.save_checkpoint: this EP rank's experts
    load_expert_shard(model, tag_dir)        # after engine.load_checkpoint: restore them
    full_state_dict_from_checkpoint(tag_dir) # offline (one process): HF state dict from a checkpoint

Every forward of a sharded model is collective over its EP group: all its ranks must run the same
number of forwards (and backwards) in the same order. Work whose count differs between ranks
(generation that stops early, conditional scoring, evaluation shards) belongs on an unsharded copy
kept fresh with copy_full_weights, as for ZeRO-3.

Checkpoints: DeepSpeed's own per-expert files assume native MoE's module layout
(`deepspeed_moe.experts.deepspeed_experts.<i>`), not HF's stacked expert tensors, so the experts
module reports `num_local_experts = 0` to DeepSpeed (it writes and reads no per-expert files) and
its model-states file (written by data-parallel rank 0) leaves the expert tensors out, as it does
for every MoE. The expert tensors go to `expert_shard_ep<r>.pt`, one per EP rank, with their global
expert range; the optimizer state of expert parameters is in DeepSpeed's per-rank ZeRO files (or
`expp_rank_<r>_mp_rank_00_optim_states.pt` at ZeRO-0). A load post-hook lets the model-states load
stay strict for every key but this module's own expert tensors.

ZeRO stages: 1 and 2. Stage 3 is refused (ValueError): DeepSpeed refuses native MoE modules there;
docs/expert_parallel.md says why and what design would compose them. Stage 0 is refused too: its
gradient clipping averages per-rank norms over the ranks (an approximation for MoE) instead of
the global norm that stages 1-2 compute, so clipped steps would not match expert_parallel_size=1.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from kernels import ops
from student import safe_load
from student.experts import expert_mlp

SHARD_FILE = "expert_shard_ep{rank}.pt"


def group_name(ep_size: int) -> str:
    return f"ep_size_{ep_size}"   # DeepSpeed's name for the EP / expert-DP group pair


def experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every transformers experts module (stacked expert tensors)."""
    return [(n, m) for n, m in model.named_modules()
            if hasattr(m, "num_experts") and hasattr(m, "down_proj") and isinstance(m.down_proj, torch.Tensor)]


def is_sharded(model: torch.nn.Module) -> bool:
    return any(isinstance(m, _EPMixin) for _, m in experts_modules(model))


# -- the experts module under EP ---------------------------------------------------------------

class _EPMixin:
    """Methods of an expert-parallel experts module; combined with its HF class and DeepSpeed's MoE."""

    ep_size: int
    ep_rank: int
    ep_group: dist.ProcessGroup
    local_experts: int
    expert_offset: int   # global id of local expert 0

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        x_TD, ids_TK = hidden_states, top_k_index.to(torch.long)
        ep, el = self.ep_size, self.local_experts
        counts_E, offsets_E1 = ops.expert_counts(ids_TK, self.num_experts)
        xs_PD, pos_TK = ops.permute(x_TD, ids_TK, offsets_E1)

        # Per (source rank, local expert) row counts, then the rows themselves.
        send_counts_RL = counts_E.to(torch.long).view(ep, el)
        recv_counts_RL = torch.empty_like(send_counts_RL)
        dist.all_to_all_single(recv_counts_RL, send_counts_RL, group=self.ep_group)
        send_splits = send_counts_RL.sum(1).tolist()
        recv_splits = recv_counts_RL.sum(1).tolist()
        xr_RD = dist_fn.all_to_all_single(xs_PD.new_empty(sum(recv_splits), xs_PD.size(1)), xs_PD,
                                          recv_splits, send_splits, group=self.ep_group)

        # Received rows are grouped by source rank, then local expert: regroup by local expert.
        local_R1 = torch.repeat_interleave(torch.arange(el, device=x_TD.device).repeat(ep),
                                           recv_counts_RL.flatten())[:, None]
        _c, loffsets_L1 = ops.expert_counts(local_R1, el)
        xl_RD, lpos_R1 = ops.permute(xr_RD, local_R1, loffsets_L1)
        yl_RD = expert_mlp(self, xl_RD, loffsets_L1).to(x_TD.dtype)
        yr_RD = ops.unpermute_combine(yl_RD, lpos_R1, torch.ones_like(lpos_R1, dtype=torch.float32))

        ys_PD = dist_fn.all_to_all_single(yr_RD.new_empty(xs_PD.shape), yr_RD, send_splits, recv_splits,
                                          group=self.ep_group)
        return ops.unpermute_combine(ys_PD, pos_TK, top_k_weights)

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
        pass   # the engine calls this on MoE modules; shard_experts made the groups already


_EP_CLASSES: dict[type, type] = {}


def _ep_class(cls: type) -> type:
    from deepspeed.moe.layer import MoE

    if cls not in _EP_CLASSES:
        _EP_CLASSES[cls] = type(f"ExpertParallel{cls.__name__}", (_EPMixin, cls, MoE), {})
    return _EP_CLASSES[cls]


def _forgive_missing_expert_keys(module: torch.nn.Module, incompatible) -> None:
    # DeepSpeed's model-states file leaves MoE expert tensors out; load_expert_shard restores them.
    for name in _expert_param_names(module):
        key = f"{module._ep_prefix}{name}"
        if key in incompatible.missing_keys:
            incompatible.missing_keys.remove(key)


def _expert_param_names(module: torch.nn.Module) -> list[str]:
    return [n for n, _ in module.named_parameters(recurse=False)]


def check_expert_parallel(ep_size: int, world_size: int, num_experts: int, zero_stage: int) -> None:
    """Raises ValueError for a combination expert parallelism does not support."""
    if ep_size < 1 or world_size % ep_size or num_experts % ep_size:
        raise ValueError(f"expert_parallel_size={ep_size} must divide the number of ranks ({world_size}) "
                         f"and the number of experts ({num_experts})")
    if ep_size > 1 and zero_stage not in (1, 2):
        why = ("DeepSpeed refuses MoE expert parameters at stage 3" if zero_stage == 3 else
               "at stage 0 DeepSpeed's gradient clipping averages per-rank norms instead of summing the "
               "expert norms of the EP ranks, so clipped updates differ from expert_parallel_size=1")
        raise ValueError(f"expert_parallel_size > 1 needs ZeRO stage 1 or 2, not {zero_stage}: {why} "
                         "(see docs/expert_parallel.md)")


def shard_experts(model: torch.nn.Module, ep_size: int, zero_stage: int) -> int:
    """Keep this rank's share of every experts module of `model`; returns how many modules.

    Creates DeepSpeed's EP groups (consecutive ranks form an EP group; ranks holding the same
    experts form an expert-data-parallel group). ep_size=1 leaves the model as it is."""
    if ep_size == 1:
        return 0
    from deepspeed.utils import groups

    mods = experts_modules(model)
    if not mods:
        raise ValueError(f"{type(model).__name__} has no experts modules to shard")
    check_expert_parallel(ep_size, dist.get_world_size(), mods[0][1].num_experts, zero_stage)
    name = group_name(ep_size)
    if name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_and_data_parallel(ep_size)
    ep_group = groups._get_expert_parallel_group(name)
    ep_rank = dist.get_rank(group=ep_group)
    for prefix, m in mods:
        el = m.num_experts // ep_size
        for pname, p in list(m.named_parameters(recurse=False)):
            if p.dim() == 0 or p.size(0) != m.num_experts:
                raise NotImplementedError(f"{prefix}.{pname}: shape {tuple(p.shape)} is not per-expert; "
                                          "expert parallelism shards stacked (E, ...) tensors only")
            local = torch.nn.Parameter(p.data[ep_rank * el:(ep_rank + 1) * el].clone(), p.requires_grad)
            local.allreduce = False        # DeepSpeed: reduce over the expert-data-parallel group
            local.group_name = name
            setattr(m, pname, local)
        m.__class__ = _ep_class(type(m))
        m.ep_size, m.ep_rank, m.ep_group = ep_size, ep_rank, ep_group
        m.local_experts, m.expert_offset = el, ep_rank * el
        # What DeepSpeed's engine reads from a MoE module (see the docstring on num_local_experts).
        m.expert_group_name, m.num_local_experts, m.enable_expert_tensor_parallelism = name, 0, False
        m._ep_prefix = f"{prefix}." if prefix else ""
        m.register_load_state_dict_post_hook(_forgive_missing_expert_keys)
    return len(mods)


def optimizer_param_groups(model: torch.nn.Module) -> list[dict]:
    """Parameter groups for the client optimizer: DeepSpeed's ZeRO needs expert parameters in
    groups of their own (marked "moe", named after their EP group). Unsharded: one plain group."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not is_sharded(model):
        return [{"params": params}]
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    return split_params_into_different_moe_groups_for_optimizer({"params": params, "name": "dense"})


# -- full weights: export, rollout copies, checkpoints -----------------------------------------

def _gather_experts(m: torch.nn.Module, local: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(local) for _ in range(m.ep_size)]
    dist.all_gather(parts, local.detach().contiguous(), group=m.ep_group)
    return torch.cat(parts)


def gather_full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every expert, in HF key layout (collective over EP groups;
    every rank gets the full dict). Unsharded models: their plain state dict."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for prefix, m in experts_modules(model):
        if isinstance(m, _EPMixin):
            for pname in _expert_param_names(m):
                state[f"{m._ep_prefix}{pname}"] = _gather_experts(m, getattr(m, pname))
    return state


@torch.no_grad()
def copy_full_weights(model: torch.nn.Module, full_model: torch.nn.Module) -> None:
    """Copy `model`'s weights (sharded or not) into the unsharded `full_model` of the same
    architecture, one expert tensor at a time (collective when sharded)."""
    full = dict(full_model.named_parameters())
    sharded = {f"{m._ep_prefix}{n}": m for _, m in experts_modules(model) if isinstance(m, _EPMixin)
               for n in _expert_param_names(m)}
    for name, p in model.named_parameters():
        src = _gather_experts(sharded[name], p) if name in sharded else p
        full[name].copy_(src)


def _shard_payload(model: torch.nn.Module) -> dict:
    mods = [m for _, m in experts_modules(model) if isinstance(m, _EPMixin)]
    first = mods[0]
    return {"ep_rank": first.ep_rank, "ep_size": first.ep_size, "num_experts": first.num_experts,
            "experts": (first.expert_offset, first.expert_offset + first.local_experts),
            "state": {f"{m._ep_prefix}{n}": getattr(m, n).detach().clone()
                      for m in mods for n in _expert_param_names(m)}}


def save_expert_shard(model: torch.nn.Module, tag_dir: str | Path) -> Path | None:
    """Write this EP rank's expert tensors to tag_dir (one writer per EP rank: the ranks of
    expert-data-parallel rank 0). Returns the file written, or None. No-op when unsharded."""
    if not is_sharded(model):
        return None
    from deepspeed.utils import groups

    payload = _shard_payload(model)
    if groups._get_expert_data_parallel_rank(group_name(payload["ep_size"])) != 0:
        return None
    path = Path(tag_dir) / SHARD_FILE.format(rank=payload["ep_rank"])
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


@torch.no_grad()
def load_expert_shard(model: torch.nn.Module, tag_dir: str | Path) -> None:
    """Restore this rank's expert tensors from save_expert_shard's file. No-op when unsharded."""
    if not is_sharded(model):
        return
    mine = _shard_payload(model)
    path = Path(tag_dir) / SHARD_FILE.format(rank=mine["ep_rank"])
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no expert shard for EP rank {mine['ep_rank']} (was the checkpoint "
                                f"saved with expert_parallel_size={mine['ep_size']}?)")
    saved = safe_load.load(path)
    if (saved["ep_size"], saved["num_experts"]) != (mine["ep_size"], mine["num_experts"]):
        raise ValueError(f"{path}: saved with ep_size={saved['ep_size']}, {saved['num_experts']} experts; "
                         f"this model has ep_size={mine['ep_size']}, {mine['num_experts']} experts")
    params = dict(model.named_parameters())
    for key, value in saved["state"].items():
        params[key].copy_(value)


def full_state_dict_from_checkpoint(tag_dir: str | Path) -> dict[str, torch.Tensor]:
    """HF state dict with every expert from a DeepSpeed checkpoint folder (ZeRO 0-2) saved with
    save_expert_shard; runs in one process, no process group needed."""
    tag_dir = Path(tag_dir)
    module = safe_load.load(tag_dir / "mp_rank_00_model_states.pt")["module"]
    shards = sorted(tag_dir.glob(SHARD_FILE.format(rank="*")))
    if not shards:
        return dict(module)
    payloads = sorted((safe_load.load(p) for p in shards),
                      key=lambda s: s["ep_rank"])
    ep = payloads[0]["ep_size"]
    if [s["ep_rank"] for s in payloads] != list(range(ep)):
        raise FileNotFoundError(f"{tag_dir}: expert shards for EP ranks {[s['ep_rank'] for s in payloads]}, "
                                f"expected 0..{ep - 1}")
    state = dict(module)
    for key in payloads[0]["state"]:
        state[key] = torch.cat([s["state"][key] for s in payloads])
    return state
