"""Reading checkpoint files without running pickled code.

`torch.load(weights_only=False)` unpickles whatever a file says, so a checkpoint folder someone
handed you can run code when it is loaded. Our own files are safetensors and JSON; DeepSpeed's
model and optimizer states are torch pickles, and DeepSpeed reads them with weights_only=False.
Here every load is weights_only=True, which accepts tensors and plain containers plus the few
classes DeepSpeed's states hold (ALLOWED, found by loading every ZeRO stage's files, fp32 and
bf16, with expert parallelism); any other global in a file is refused before anything runs.
"""
from __future__ import annotations

import os
import pickle
import re
from contextlib import contextmanager
from pathlib import Path

import torch


def _allowed() -> list:
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    # LossScaler: the ZeRO optimizer's (static) loss scale; ZeroStageEnum: the stage it was saved
    # at; fragment_address: where each parameter's slice sits in the flat partition.
    return [LossScaler, ZeroStageEnum, fragment_address]


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file holds pickled objects beyond tensors and DeepSpeed's few plain classes."""


def _refusal(path, err: pickle.UnpicklingError) -> UnsafeCheckpointError:
    found = re.search(r"GLOBAL ([\w.]+)", str(err))
    what = f"the global {found.group(1)}" if found else "objects other than tensors"
    return UnsafeCheckpointError(f"{path}: refused to load: it holds {what}, which a pickle may use to run "
                                 "code (only tensors and DeepSpeed's optimizer classes are read)")


def load(path: str | Path, map_location="cpu"):
    """torch.load a checkpoint file with weights_only=True and DeepSpeed's classes allowed."""
    try:
        with torch.serialization.safe_globals(_allowed()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise _refusal(path, err) from None


@contextmanager
def weights_only_loads(where: str | Path = "a checkpoint file"):
    """Every torch.load inside, DeepSpeed's own included (they pass weights_only=False), reads with
    weights_only=True and ALLOWED: torch's TORCH_FORCE_WEIGHTS_ONLY_LOAD switch, set for the call.
    A refused file raises UnsafeCheckpointError naming `where` and the global it held."""
    saved = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(_allowed()):
            yield
    except pickle.UnpicklingError as err:
        raise _refusal(where, err) from None
    finally:
        if saved is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = saved
