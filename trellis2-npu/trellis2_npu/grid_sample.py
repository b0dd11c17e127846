"""Trilinear sampling of a sparse voxel grid with renormalised weights, FlexGEMM's ``grid_sample_3d`` in torch.

Adapted from: JeffreyXiang/FlexGEMM @ 6dd94a8, ``flex_gemm/ops/grid_sample/grid_sample.py::grid_sample_3d`` and
its kernel ``flex_gemm/kernels/cuda/grid_sample/grid_sample.cu::
hashmap_lookup_grid_sample_3d_trilinear_neighbor_map_weight_kernel``, as called by microsoft/TRELLIS.2 @ 5565d240
``trellis2/representations/mesh/base.py::MeshWithVoxel.query_attrs`` and ``o-voxel/o_voxel/postprocess.py::to_glb``.

This is not ``F.grid_sample``. Queries are in voxel units with voxel ``i`` centred at ``i + 0.5``; the 8 voxels
around ``floor(q - 0.5)`` get the usual trilinear weights, absent ones (or ones outside the grid) get 0, and the
rest are renormalised to sum to 1. A query with no present neighbour, or whose present neighbours all have weight
0, samples 0.
Changes: voxel lookup by sorted keys and ``torch.searchsorted`` (:mod:`trellis2_npu.voxel_lookup`) instead of a
CUDA hash; queries are processed in chunks of ``chunk_size``; weights are computed in the precision of
``feats``/``grid`` (at least float32), where FlexGEMM always uses float32; only ``mode="trilinear"`` is ported.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from deliverykit.cpu_tasks import task_runner

from .voxel_lookup import VoxelIndex, build_voxel_index, lookup_voxel_pairs

MIN_WEIGHT_SUM = 1e-12  # FlexGEMM divides by max(weight sum, 1e-12)
DEFAULT_CHUNK_SIZE = 1 << 18  # queries per chunk: ~50 MB of int64 neighbour coordinates


def grid_sample_3d(
    feats: torch.Tensor,
    coords: torch.Tensor,
    shape: Sequence[int],
    grid: torch.Tensor,
    mode: str = "trilinear",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Sample sparse voxel features at continuous points, renormalising over the voxels that exist.

    Drop-in for ``flex_gemm.ops.grid_sample.grid_sample_3d``. Queries of batch item ``b`` (row ``b`` of ``grid``)
    only see voxels whose ``coords[:, 0] == b``.

    Args:
        feats (`torch.Tensor`): ``[N, C]`` voxel features.
        coords (`torch.Tensor`): ``[N, 4]`` integer ``(batch, x, y, z)`` of each feature row.
        shape (`Sequence[int]`): grid shape whose last three entries are ``(W, H, D)``, e.g.
            ``torch.Size([1, C, W, H, D])``; voxels outside ``[0, W) × [0, H) × [0, D)`` are never sampled.
        grid (`torch.Tensor`): ``[B, L, 3]`` query points in voxel units (``(p - origin) / voxel_size``).
        mode (`str`, *optional*, defaults to `"trilinear"`): only ``"trilinear"`` is supported.
        chunk_size (`int`, *optional*, defaults to 262144): queries processed at once, to bound memory.

    Returns:
        `torch.Tensor`: ``[B, L, C]`` samples, dtype of ``feats``.
    """
    _check_inputs(feats, coords, shape, grid, mode, chunk_size)
    num_items, num_queries = grid.shape[:2]
    index = build_voxel_index(coords)
    grid_shape = torch.tensor(tuple(shape[-3:]), dtype=torch.long, device=grid.device)
    points = grid.reshape(-1, 3)

    def sample(start: int) -> torch.Tensor:
        return _sample_trilinear(feats, index, grid_shape, points[start : start + chunk_size], start, num_queries)

    chunks = task_runner(grid.device)(sample, range(0, points.shape[0], chunk_size))  # on single-threaded workers
    if not chunks:
        return feats.new_zeros(num_items, num_queries, feats.shape[1])
    return torch.cat(chunks).reshape(num_items, num_queries, feats.shape[1])


def _sample_trilinear(
    feats: torch.Tensor,
    index: VoxelIndex,
    grid_shape: torch.Tensor,
    points: torch.Tensor,
    first_query: int,
    queries_per_item: int,
) -> torch.Tensor:
    """Samples ``[P, C]`` for the flattened queries ``first_query .. first_query + P`` of the ``[B, L, 3]`` grid."""
    dtype = torch.promote_types(torch.promote_types(feats.dtype, points.dtype), torch.float32)
    points = points.to(dtype)
    corners = torch.floor(points - 0.5).long().unsqueeze(1) + _corner_offsets(points.device)  # [P, 8, 3]
    distance = (points.unsqueeze(1) - corners.to(dtype) - 0.5).abs()
    weights = (1 - distance[..., 0]) * (1 - distance[..., 1]) * (1 - distance[..., 2])  # [P, 8]

    query_ids = torch.arange(first_query, first_query + points.shape[0], device=points.device)
    batch = (query_ids // queries_per_item).reshape(-1, 1, 1).expand(-1, 4, 1)
    # corners k and k + 4 differ only in z, the last key column: one search finds both
    positions, found = lookup_voxel_pairs(index, torch.cat([batch, corners[:, :4]], dim=-1))  # [P, 4, 2]
    positions, found = positions.transpose(1, 2).reshape(-1, 8), found.transpose(1, 2).reshape(-1, 8)
    present = found & ((corners >= 0) & (corners < grid_shape)).all(dim=-1)

    weights = torch.where(present, weights, 0)
    weights = weights / weights.sum(dim=1, keepdim=True).clamp_min(MIN_WEIGHT_SUM)
    values = feats.index_select(0, positions.clamp_min(0).reshape(-1)).reshape(*positions.shape, -1)
    values = values.to(dtype).masked_fill(~present.unsqueeze(-1), 0)  # an absent voxel adds nothing, even inf/nan
    return (weights.unsqueeze(-1) * values).sum(dim=1).to(feats.dtype)


def _check_inputs(
    feats: torch.Tensor,
    coords: torch.Tensor,
    shape: Sequence[int],
    grid: torch.Tensor,
    mode: str,
    chunk_size: int,
) -> None:
    """FlexGEMM's shape assertions, as ``ValueError`` messages that name the fix."""
    if mode != "trilinear":
        raise ValueError(f"grid_sample_3d supports mode='trilinear' only, got mode={mode!r}; pass mode='trilinear'")
    if feats.dim() != 2:
        raise ValueError(f"feats must be [N, C], got shape {tuple(feats.shape)}")
    if coords.dim() != 2 or coords.shape[1] != 4 or coords.shape[0] != feats.shape[0]:
        raise ValueError(
            f"coords must be [N, 4] (batch, x, y, z) with N = {feats.shape[0]} rows like feats, "
            f"got shape {tuple(coords.shape)}; prepend a zero batch column to [N, 3] coordinates"
        )
    if len(shape) < 3:
        raise ValueError(f"shape must end with the grid size (W, H, D), got {tuple(shape)}")
    if grid.dim() != 3 or grid.shape[2] != 3:
        raise ValueError(f"grid must be [B, L, 3] query points, got shape {tuple(grid.shape)}; reshape(1, -1, 3)")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of queries, got {chunk_size}")


@functools.cache
def _corner_offsets(device: torch.device) -> torch.Tensor:
    """``[8, 3]`` offsets of the 8 neighbours, corner ``i`` at ``(i & 1, i >> 1 & 1, i >> 2 & 1)`` as FlexGEMM."""
    return torch.tensor([[i & 1, (i >> 1) & 1, (i >> 2) & 1] for i in range(8)], dtype=torch.long, device=device)
