"""Find integer voxel coordinates in a sparse voxel set with sorted int64 keys and ``torch.searchsorted``.

TRELLIS.2 and FlexGEMM look voxels up in a CUDA linear-probing hash table (``o-voxel/src/hash/hash.cu``,
``flex_gemm/kernels/cuda/hash``). That table has no NPU or CPU build, so this module replaces it with plain tensor
ops that exist on every backend: each coordinate row becomes one int64 key (row-major over the bounding box of the
stored coordinates), the keys are sorted once, and a query is a binary search plus one equality check.

Coordinates are rows of any width: ``(x, y, z)`` for one item, or ``(batch, x, y, z)`` with the batch id as an
ordinary leading column. A query outside the bounding box of the stored voxels is "not found" without computing
its key, so keys cannot overflow or alias.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NOT_FOUND = -1  # position reported for a query that is not in the index (upstream's hash returns 0xffffffff)
_MAX_KEY_SPACE = 2**62  # keep every key and stride well inside int64


@dataclass(frozen=True)
class VoxelIndex:
    """Sorted keys of a voxel set; build it with :func:`build_voxel_index`.

    Attributes:
        sorted_keys (`torch.Tensor`): ``[N]`` int64, ascending.
        order (`torch.Tensor`): ``[N]`` int64, row of ``coords`` that holds ``sorted_keys[i]``.
        origin (`torch.Tensor`): ``[K]`` int64, per-column minimum of ``coords``.
        extent (`torch.Tensor`): ``[K]`` int64, per-column ``max - min + 1``.
        strides (`torch.Tensor`): ``[K]`` int64, row-major strides of the bounding box.
    """

    sorted_keys: torch.Tensor
    order: torch.Tensor
    origin: torch.Tensor
    extent: torch.Tensor
    strides: torch.Tensor

    @property
    def num_voxels(self) -> int:
        return self.sorted_keys.shape[0]


def build_voxel_index(coords: torch.Tensor) -> VoxelIndex:
    """Index the integer coordinate rows ``coords`` (``[N, K]``, any integer dtype) for :func:`lookup_voxels`.

    Duplicate rows are allowed; a lookup then returns the first of them (upstream's hash keeps an arbitrary one).
    Costs two host syncs: one to check that the bounding box fits int64 keys, one to skip the sort when the rows
    come in key order already.
    """
    if coords.dim() != 2 or coords.is_floating_point():
        raise ValueError(
            f"coords must be an [N, K] integer tensor, got shape {tuple(coords.shape)} dtype {coords.dtype}; "
            "pass voxel coordinates such as SparseTensor.coords"
        )
    coords = coords.long()
    if coords.shape[0] == 0:
        zeros = coords.new_zeros(coords.shape[1])
        return VoxelIndex(coords.new_zeros(0), coords.new_zeros(0), zeros, zeros + 1, zeros + 1)
    origin = coords.amin(dim=0)
    extent = coords.amax(dim=0) - origin + 1
    key_space = float(extent.double().prod())
    if key_space >= _MAX_KEY_SPACE:
        raise ValueError(
            f"voxel coordinates span a box of {key_space:.3g} cells, more than int64 keys allow ({_MAX_KEY_SPACE}); "
            "index fewer or closer voxels at a time"
        )
    strides = _row_major_strides(extent)
    keys = ((coords - origin) * strides).sum(dim=1)
    if bool((keys[1:] >= keys[:-1]).all()):  # rows already in order (e.g. from nonzero()): the stable sort's result
        return VoxelIndex(keys, torch.arange(len(keys), device=keys.device), origin, extent, strides)
    sorted_keys, order = torch.sort(keys, stable=True)
    return VoxelIndex(sorted_keys, order, origin, extent, strides)


def lookup_voxels(index: VoxelIndex, query_coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Find each query row among the indexed coordinates.

    Args:
        index (`VoxelIndex`): from :func:`build_voxel_index`.
        query_coords (`torch.Tensor`): ``[..., K]`` integer coordinates, same column meaning as the indexed ones.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``positions`` (``[...]`` int64, row of the indexed ``coords``, or
        ``NOT_FOUND``) and ``found`` (``[...]`` bool).
    """
    if query_coords.shape[-1] != index.origin.shape[0]:
        raise ValueError(
            f"query_coords have {query_coords.shape[-1]} columns but the index was built from "
            f"{index.origin.shape[0]}; pass coordinates with the same columns as build_voxel_index got"
        )
    batch_shape = query_coords.shape[:-1]
    if index.num_voxels == 0:
        found = torch.zeros(batch_shape, dtype=torch.bool, device=query_coords.device)
        return torch.full(batch_shape, NOT_FOUND, dtype=torch.long, device=query_coords.device), found
    offset = query_coords.long() - index.origin
    inside = ((offset >= 0) & (offset < index.extent)).all(dim=-1)
    keys = (torch.minimum(offset.clamp_min(0), index.extent - 1) * index.strides).sum(dim=-1)
    slot = torch.searchsorted(index.sorted_keys, keys.reshape(-1)).clamp_max(index.num_voxels - 1).reshape(keys.shape)
    found = inside & (index.sorted_keys[slot] == keys)
    positions = torch.where(found, index.order[slot], NOT_FOUND)
    return positions, found


def _row_major_strides(extent: torch.Tensor) -> torch.Tensor:
    """Strides of a C-ordered box with side lengths ``extent``: last column varies fastest."""
    tail = torch.cumprod(extent.flip(0), dim=0).flip(0)
    return torch.cat([tail[1:], tail.new_ones(1)])
