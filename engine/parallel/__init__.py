"""Tensor parallelism: one model sharded over ranks (Megatron-style), rank 0 in this process.

    shard.py          which slice of each checkpoint tensor a rank holds
    group.py          the collectives (torch.distributed: NCCL on CUDA, gloo on CPU)
    sharded_model.py  a rank's model; rank 0's hands every call to the others first
    handoff.py        the leader's messages and a step's one broadcast
    launch.py         rank 0 starts ranks 1..N-1 and watches them (no orphans)
    worker_proc.py    a follower rank's process
"""

from __future__ import annotations

import pathlib

import torch

from inflight.engine.parallel.group import TensorParallelError
from inflight.engine.parallel.launch import TensorParallelGroup

__all__ = ["TensorParallelError", "TensorParallelGroup", "load_model"]


def load_model(config, folder: pathlib.Path, ops, device: torch.device,
               group: TensorParallelGroup | None = None):
    """The engine's model: a plain `DecoderModel`, or rank 0's shard of it on `group` (started
    here for `config.tensor_parallel_size` ranks when not given) -> (model, group or None).

    NOTE: every rank builds its model from LOAD's JSON (engine/parallel/sharded_model.py,
    `LeaderModel`): an argument added to `DecoderModel` goes there too (as `kv_dtype` does, by
    its kv_cache_dtype name), or the followers would build another model than rank 0's."""
    from inflight.engine.errors import ConfigError
    from inflight.engine.model import DecoderModel
    from inflight.engine.parallel.sharded_model import LeaderModel

    if not config.tensor_parallel and group is None:
        return DecoderModel(folder, ops, config.torch_dtype, device, config.max_model_len,
                          config.kv_torch_dtype), None
    from inflight.engine.model_config import ModelConfig
    from inflight.engine.parallel.shard import ShardPlan

    ShardPlan.of(ModelConfig.from_folder(folder), 0, config.tensor_parallel_size)  # before any rank starts
    owned = group is None
    if owned:
        group = TensorParallelGroup(config.tensor_parallel_size, device)
    elif group.world != config.tensor_parallel_size:
        raise ConfigError(f"EngineConfig.tensor_parallel_size={config.tensor_parallel_size} but the "
                          f"given group has {group.world} ranks")
    try:
        model = LeaderModel(folder, ops, config.torch_dtype, device, config.max_model_len,
                            config.kv_torch_dtype, tp=group)
    except BaseException:
        if owned:
            group.close()
        raise
    if owned:
        group.owner = model
    return model, group
