"""Ulysses sequence parallel for the LTX-2.3 transformer, installed through diffusers' own context-parallel hooks.

diffusers 0.42.1 ships LTX-1's ``_cp_plan`` on ``LTX2VideoTransformer3DModel`` (issue #14316): it splits the video
latents, the text and the video self-attention RoPE, but not the coordinates the cross-attention RoPE is built from,
nor per-token timesteps, so the cross-attention tables and image-to-video modulation stay whole while the tokens
are split. :data:`LTX23_CP_PLAN` splits at the transformer's entry, each on its token axis:

- the video latents and their per-token timesteps (image-to-video ``[B, S]``; a per-sample ``[B]`` is left whole
  through ``expected_dims``) and the video coordinates, so both video RoPE tables (self, cross) come out split;
- both text streams with their 2-D masks (Ulysses all-to-alls K/V and all-gathers a local mask: text keys are
  split like any other keys); the text length (``max_sequence_length``, 1024) must be a multiple of U;
- ``proj_out`` is gathered back, so the caller sees the whole video sequence.

The **audio stream is replicated**, not split: it is short (≈ 1/40 of the video tokens at 704x480x161) and its
length rarely divides by U, and diffusers' uneven ``ulysses_anything`` path all-gathers unequal shapes, which gloo
refuses. Replication is exact: after the all-to-all a replicated sequence arrives U times, and attention over U
identical copies of every key gives the same softmax (each weight and its normaliser scale by U) and U identical
query rows; the reverse all-to-all hands every rank its full copy back. It costs U-fold audio attention work, small.

Two more pieces make diffusers' Ulysses path correct for this model:

- LTX-2's processors repeat a mask per head (``[B, H, 1, S]``) while after the all-to-all a rank holds H/U heads:
  ``attention.dispatch_ltx2_attention`` reduces such a mask to one head before the Ulysses call;
- ``reference_fixes`` feeds the cross-attention scale/shift embedders each stream's own timesteps, read before the
  hooks split them: :func:`_split_own_timesteps` splits a per-token one the same way as the tokens.

diffusers' ``_resolve_parallel_config`` puts a rank on ``<accelerator>:rank % device_count`` (a ZeroDivisionError on
a CPU-only host and no say for ``LOCAL_RANK``); :func:`enable_ulysses` resolves it with the rank's own device and the
mesh of :mod:`sulphur2_npu.parallel`, then calls ``enable_parallelism`` itself.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from diffusers.models._modeling_parallel import (
    ContextParallelConfig,
    ContextParallelInput,
    ContextParallelOutput,
    ParallelConfig,
)

_ROOT = {
    "hidden_states": ContextParallelInput(split_dim=1, expected_dims=3),
    "timestep": ContextParallelInput(split_dim=1, expected_dims=2),
    "video_coords": ContextParallelInput(split_dim=2, expected_dims=4),
    "video_keyframes_mask": ContextParallelInput(split_dim=1, expected_dims=3),
    "encoder_hidden_states": ContextParallelInput(split_dim=1, expected_dims=3),
    "encoder_attention_mask": ContextParallelInput(split_dim=1, expected_dims=2),
    "audio_encoder_hidden_states": ContextParallelInput(split_dim=1, expected_dims=3),
    "audio_encoder_attention_mask": ContextParallelInput(split_dim=1, expected_dims=2),
}
LTX23_CP_PLAN: dict[str, Any] = {"": _ROOT, "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}
# The audio stream's inputs with a token axis, replicated on purpose (module docstring).
REPLICATED = ("audio_hidden_states", "audio_timestep", "audio_coords")
_SCALE_SHIFT_EMBEDDERS = ("av_cross_attn_video_scale_shift",)  # the audio one sees replicated audio timesteps


def unplanned_inputs(plan: dict[str, Any], kwargs: dict[str, Any], token_counts: set[int]) -> list[str]:
    """Tensor arguments of one transformer call with a token axis (a dim >= 1 whose length is in ``token_counts``)
    that the plan's entry (``plan[""]``) neither splits nor lists as replicated: each would stay whole while its
    stream is split. An empty list means the plan covers the call.
    """
    root = plan.get("", {})
    return [
        name
        for name, value in kwargs.items()
        if isinstance(value, torch.Tensor)
        and name not in root
        and name not in REPLICATED
        and any(size in token_counts for size in value.shape[1:])
    ]


def _split_own_timesteps(config: ContextParallelConfig, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    timesteps, batch = args[0], kwargs.get("batch_size")
    if batch is None or timesteps.numel() == batch:  # one timestep per sample: nothing to split
        return None
    import torch.distributed as dist

    mesh = config._flattened_mesh
    per_token = timesteps.reshape(batch, -1)
    shard = per_token.chunk(mesh.size(), dim=1)[dist.get_rank(mesh.get_group())]  # as EquipartitionSharder
    return (shard.flatten(), *args[1:]), kwargs


def _name_planned_inputs(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    # diffusers' split hook looks a planned input up in the positional arguments when it is not a keyword, and
    # raises when a call leaves it at its default (the T2V pipeline passes no audio_timestep): name them all.
    return args, {name: None for name in _ROOT} | kwargs


def enable_ulysses(transformer: torch.nn.Module, *, degree: int, device: torch.device, mesh: Any) -> ParallelConfig:
    """Split ``transformer`` over the ``ulysses`` axis of ``mesh`` (dims guidance, ring, ulysses) with our plan."""
    cp = ContextParallelConfig(ulysses_degree=degree, mesh=mesh)
    config = ParallelConfig(context_parallel_config=cp)

    def resolve(_config: Any) -> ParallelConfig:
        import torch.distributed as dist

        config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=mesh)
        transformer._parallel_config = config
        return config

    transformer._resolve_parallel_config = resolve  # instance attribute: diffusers' method stays as it is
    try:
        transformer.enable_parallelism(config=config, cp_plan=LTX23_CP_PLAN)
    finally:
        del transformer._resolve_parallel_config
    transformer.register_forward_pre_hook(_name_planned_inputs, with_kwargs=True)
    for name in _SCALE_SHIFT_EMBEDDERS:
        getattr(transformer, name).register_forward_pre_hook(
            functools.partial(_split_own_timesteps, cp), with_kwargs=True
        )
    return config
