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
        has_duplicates (`bool`): whether some coordinate row is indexed more than once.
    """

    sorted_keys: torch.Tensor
    order: torch.Tensor
    origin: torch.Tensor
    extent: torch.Tensor
    strides: torch.Tensor
    has_duplicates: bool = False

    @property
    def num_voxels(self) -> int:
        return self.sorted_keys.shape[0]


def build_voxel_index(coords: torch.Tensor) -> VoxelIndex:
    """Index the integer coordinate rows ``coords`` (``[N, K]``, any integer dtype) for :func:`lookup_voxels`.

    Duplicate rows are allowed; a lookup then returns the first of them (upstream's hash keeps an arbitrary one).
    Costs three host syncs: one to check that the bounding box fits int64 keys, one to skip the sort when the rows
    come in key order already, one to note duplicates (:func:`lookup_voxel_pairs`).
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
        sorted_keys, order = keys, torch.arange(len(keys), device=keys.device)
    else:
        sorted_keys, order = torch.sort(keys, stable=True)
    has_duplicates = bool((sorted_keys[1:] == sorted_keys[:-1]).any())
    return VoxelIndex(sorted_keys, order, origin, extent, strides, has_duplicates)


def lookup_voxels(index: VoxelIndex, query_coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Find each query row among the indexed coordinates.

    Args:
        index (`VoxelIndex`): from :func:`build_voxel_index`.
        query_coords (`torch.Tensor`): ``[..., K]`` integer coordinates, same column meaning as the indexed ones.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``positions`` (``[...]`` int64, row of the indexed ``coords``, or
        ``NOT_FOUND``) and ``found`` (``[...]`` bool).
    """
    _check_columns(index, query_coords)
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


def lookup_voxel_pairs(index: VoxelIndex, query_coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`lookup_voxels` of each query row and of its neighbour one step along the last column, from one search.

    The last column varies fastest in the keys, so that neighbour's key is the query's plus one: it sits at the
    query's slot when the query itself is absent, at the next slot when it is present (indexed rows being distinct),
    and the trilinear sampling's 8 corners cost 4 searches instead of 8.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``positions`` and ``found``, ``[..., 2]``: ``[..., 0]`` for the query
        rows, ``[..., 1]`` for the rows one step further, exactly as :func:`lookup_voxels` gives them.
    """
    _check_columns(index, query_coords)
    if index.num_voxels == 0 or index.has_duplicates:  # duplicates: the neighbour's first copy needs its own search
        step = torch.zeros_like(query_coords)
        step[..., -1] = 1
        return lookup_voxels(index, torch.stack([query_coords, query_coords + step], dim=-2))
    offset = query_coords.long() - index.origin
    inside = (offset >= 0) & (offset < index.extent)
    leading_inside = inside[..., :-1].all(dim=-1)
    last = offset[..., -1]
    leading = torch.minimum(offset[..., :-1].clamp_min(0), index.extent[:-1] - 1)
    keys = (leading * index.strides[:-1]).sum(dim=-1) + last  # the last stride is 1; out-of-box rows are masked
    slot = torch.searchsorted(index.sorted_keys, keys.reshape(-1)).clamp_max(index.num_voxels - 1).reshape(keys.shape)
    present = index.sorted_keys[slot] == keys
    next_slot = (slot + present.long()).clamp_max(index.num_voxels - 1)
    next_inside = (last + 1 >= 0) & (last + 1 < index.extent[-1])
    found = torch.stack(
        [
            leading_inside & inside[..., -1] & present,
            leading_inside & next_inside & (index.sorted_keys[next_slot] == keys + 1),
        ],
        dim=-1,
    )
    positions = torch.where(found, index.order[torch.stack([slot, next_slot], dim=-1)], NOT_FOUND)
    return positions, found


def _check_columns(index: VoxelIndex, query_coords: torch.Tensor) -> None:
    if query_coords.shape[-1] != index.origin.shape[0]:
        raise ValueError(
            f"query_coords have {query_coords.shape[-1]} columns but the index was built from "
            f"{index.origin.shape[0]}; pass coordinates with the same columns as build_voxel_index got"
        )


def _row_major_strides(extent: torch.Tensor) -> torch.Tensor:
    """Strides of a C-ordered box with side lengths ``extent``: last column varies fastest."""
    tail = torch.cumprod(extent.flip(0), dim=0).flip(0)
    return torch.cat([tail[1:], tail.new_ones(1)])
