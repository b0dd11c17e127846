"""Submanifold sparse 3D convolution in plain PyTorch, a stand-in for FlexGEMM's ``sparse_submanifold_conv3d``.

Adapted from: JeffreyXiang/FlexGEMM @ 6dd94a8, ``flex_gemm/ops/spconv/submanifold_conv3d.py``, as called by
microsoft/TRELLIS.2 @ 5565d240 ``trellis2/modules/sparse/conv/conv_flex_gemm.py::sparse_conv3d_forward``, which
every ``SparseConv3d`` of the TRELLIS.2 decoders runs through.

Semantics: output sites are the input sites, in the same order, and
``out[p] = bias + Σ_v W[:, v] · feats[p + offset_v]`` over the kernel offsets whose neighbour is an active site of the
same batch item. The weight keeps the released checkpoints' layout ``[Co, K0, K1, K2, Ci]`` with K0 ↔ x
(``coords[:, 1]``), K1 ↔ y, K2 ↔ z; offset index ``v = i0·K1·K2 + i1·K2 + i2`` is the shift
``((i0 - K0//2)·d0, (i1 - K1//2)·d1, (i2 - K2//2)·d2)``. The dense equivalent is ``F.conv3d`` with weight
``W.permute(0, 4, 1, 2, 3)`` and ``padding = dilation·(K//2)`` on the densified grid; reading ``W`` as
``[Co, Ci, K, K, K]`` runs without error and gives wrong features.

Changes:
- the neighbour map is found with sorted int64 keys and ``torch.searchsorted`` (:mod:`trellis2_npu.voxel_lookup`)
  instead of a CUDA hash table, and stored as (input row → output row) pairs per kernel offset, without the centre;
- the product is gather → one GEMM per kernel offset → a per-output-row sum of the products with
  ``F.embedding_bag`` (a CSR segment sum), block by block of output rows. FlexGEMM's torch path
  (``explicit_gemm``) builds an ``[N, K³·Ci]`` im2col instead, which on a surface spends ~60 % of its FLOPs and
  memory on absent neighbours (a sphere shell has ~10.5 of 27); scattering the products with ``index_add_``
  measured ~3× slower per row than the bag-sum on the CPU;
- on the CPU a block is ``CPU_ROWS_PER_BLOCK`` output rows, so that a block's gathered rows and products stay in
  cache; elsewhere blocks are large (few kernel launches) and only bound the two buffers' memory. The map costs
  8 bytes per pair (int32) plus 4 per site;
- only odd kernel sizes (centred kernels, all TRELLIS.2 uses) and stride 1.
"""

from __future__ import annotations

import itertools
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .voxel_lookup import build_voxel_index

CPU_ROWS_PER_BLOCK = 2048  # output rows per block on the CPU: ~20k pairs, whose products stay in cache
ACCELERATOR_ROWS_PER_BLOCK = 1 << 16  # elsewhere: few large kernels; buffers ≤ 27·65536 rows even on dense sets


@dataclass(frozen=True, eq=False)  # holds tensors: identity, not elementwise comparison
class NeighborBlock:
    """The active neighbour pairs whose output row lies in ``[start, end)``, ready for gather → GEMM → bag-sum.

    Attributes:
        start (`int`), end (`int`): the block's output rows.
        src (`torch.Tensor`): ``[P]`` int32, input row of each pair; pairs are grouped by kernel offset.
        offset_ranges (`tuple[tuple[int, int, int], ...]`): ``(offset index, begin, end)``: ``src[begin:end]``
            are the pairs of that kernel offset.
        bag_indices (`torch.Tensor`): ``[P]`` int32, positions into ``src`` ordered by output row, then offset.
        bag_offsets (`torch.Tensor`): ``[end - start + 1]`` int32, output row ``start + i`` sums the pairs at
            ``bag_indices[bag_offsets[i]:bag_offsets[i + 1]]``.
    """

    start: int
    end: int
    src: torch.Tensor
    offset_ranges: tuple[tuple[int, int, int], ...]
    bag_indices: torch.Tensor
    bag_offsets: torch.Tensor

    @property
    def num_pairs(self) -> int:
        return self.src.shape[0]


@dataclass(frozen=True, eq=False)  # holds tensors: identity, not elementwise comparison
class NeighborMap:
    """Which input site feeds which output site through which kernel offset, for one voxel set.

    Built by :func:`build_neighbor_map` and shared by every convolution with the same voxel set, kernel size and
    dilation, like FlexGEMM's ``SubMConv3dNeighborCache`` (which TRELLIS.2 stores on its ``SparseTensor`` under
    :func:`neighbor_cache_key`). The centre offset pairs every site with itself and is not stored.

    Attributes:
        kernel_size (`tuple[int, int, int]`): (K0, K1, K2), K0 along x.
        dilation (`tuple[int, int, int]`): per axis.
        num_voxels (`int`): number of sites, input and output.
        blocks (`tuple[NeighborBlock, ...]`): blocks of output rows that have at least one non-centre neighbour.
    """

    kernel_size: tuple[int, int, int]
    dilation: tuple[int, int, int]
    num_voxels: int
    blocks: tuple[NeighborBlock, ...]

    @property
    def num_pairs(self) -> int:
        """Active neighbour pairs including the centre: the useful FLOPs of a convolution are 2·Ci·Co times this."""
        return self.num_voxels + sum(block.num_pairs for block in self.blocks)

    @property
    def max_block_pairs(self) -> int:
        return max((block.num_pairs for block in self.blocks), default=0)


def neighbor_cache_key(kernel_size: int | Sequence[int], dilation: int | Sequence[int] = 1) -> str:
    """The spatial-cache key under which TRELLIS.2 keeps the neighbour map of a convolution.

    Same string as ``conv_flex_gemm.py`` builds, e.g. ``SubMConv3d_neighbor_cache_3x3x3_dilation(1, 1, 1)``.
    Upstream unpacks the weight shape as ``(Co, Kd, Kh, Kw, Ci)`` and prints ``{Kw}x{Kh}x{Kd}``, so an
    anisotropic kernel (K0, K1, K2) reads ``K2xK1xK0``.
    """
    k0, k1, k2 = _triple(kernel_size, "kernel_size")
    return f"SubMConv3d_neighbor_cache_{k2}x{k1}x{k0}_dilation{_triple(dilation, 'dilation')}"


def build_neighbor_map(
    coords: torch.Tensor,
    spatial_shape: Sequence[int],
    kernel_size: int | Sequence[int] = 3,
    dilation: int | Sequence[int] = 1,
    rows_per_block: int | None = None,
) -> NeighborMap:
    """Find every active neighbour of every site of a sparse voxel set, for a submanifold convolution.

    Args:
        coords (`torch.Tensor`): ``[N, 4]`` integer ``(batch, x, y, z)`` rows, no duplicates (as
            ``SparseTensor.coords``).
        spatial_shape (`Sequence[int]`): grid size ``(X, Y, Z)``; neighbours outside ``[0, X) × [0, Y) × [0, Z)``
            are absent, and every site must lie inside it.
        kernel_size (`int` or `Sequence[int]`, defaults to 3): odd, per axis (K0 along x).
        dilation (`int` or `Sequence[int]`, defaults to 1): per axis.
        rows_per_block (`int`, *optional*): output rows per block; defaults to ``CPU_ROWS_PER_BLOCK`` on the CPU
            and ``ACCELERATOR_ROWS_PER_BLOCK`` elsewhere.

    Costs a few host syncs (input checks, group sizes); the convolutions that reuse the map cost none.
    """
    kernel_size = _triple(kernel_size, "kernel_size")
    dilation = _triple(dilation, "dilation")
    _check_kernel(kernel_size, dilation)
    _check_coords(coords, spatial_shape)
    if rows_per_block is None:
        rows_per_block = CPU_ROWS_PER_BLOCK if coords.device.type == "cpu" else ACCELERATOR_ROWS_PER_BLOCK
    num_voxels = coords.shape[0]
    if num_voxels == 0 or kernel_size == (1, 1, 1):
        return NeighborMap(kernel_size, dilation, num_voxels, ())
    num_offsets = kernel_size[0] * kernel_size[1] * kernel_size[2]
    per_offset = _find_neighbors(coords, kernel_size, dilation)
    blocks = _split_into_blocks(per_offset, num_voxels, num_offsets, rows_per_block)
    return NeighborMap(kernel_size, dilation, num_voxels, blocks)


def cached_neighbor_map(
    cache: MutableMapping[str, Any],
    coords: torch.Tensor,
    spatial_shape: Sequence[int],
    kernel_size: int | Sequence[int] = 3,
    dilation: int | Sequence[int] = 1,
) -> NeighborMap:
    """The neighbour map of ``coords`` from ``cache`` under :func:`neighbor_cache_key`, built and stored on a miss.

    ``cache`` is any dict that lives exactly as long as the voxel set (one per decoder level): every convolution of
    that level then shares one map. Upstream's own convolution keeps the map that :func:`sparse_submanifold_conv3d`
    returns with ``SparseTensor.register_spatial_cache`` under the same key.
    """
    key = neighbor_cache_key(kernel_size, dilation)
    neighbor_map = cache.get(key)
    if neighbor_map is None:
        neighbor_map = build_neighbor_map(coords, spatial_shape, kernel_size, dilation)
        cache[key] = neighbor_map
    return neighbor_map


def submanifold_conv3d(
    feats: torch.Tensor,
    neighbor_map: NeighborMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Submanifold sparse convolution of ``feats`` over the voxel set that ``neighbor_map`` describes.

    Args:
        feats (`torch.Tensor`): ``[N, Ci]``, row ``i`` belongs to site ``coords[i]``.
        neighbor_map (`NeighborMap`): from :func:`build_neighbor_map` for these sites.
        weight (`torch.Tensor`): ``[Co, K0, K1, K2, Ci]``, the TRELLIS.2 / FlexGEMM checkpoint layout.
        bias (`torch.Tensor`, *optional*): ``[Co]``.

    Returns:
        `torch.Tensor`: ``[N, Co]``, same site order as ``feats``.
    """
    _check_conv_inputs(feats, neighbor_map, weight, bias)
    out_channels, in_channels = weight.shape[0], weight.shape[-1]
    num_offsets = weight.shape[1] * weight.shape[2] * weight.shape[3]
    # [V, Ci, Co]: one right-hand GEMM operand per kernel offset (a copy of the weight, tiny next to the features)
    offset_weights = weight.reshape(out_channels, num_offsets, in_channels).permute(1, 2, 0).contiguous()
    centre = offset_weights[num_offsets // 2]
    out = feats @ centre if bias is None else torch.addmm(bias, feats, centre)
    recording = torch.is_grad_enabled() and (feats.requires_grad or weight.requires_grad)
    # Reused across blocks; out= buffers record no autograd history, so a differentiable call allocates per block.
    gathered = None if recording else feats.new_empty(neighbor_map.max_block_pairs, in_channels)
    products = None if recording else feats.new_empty(neighbor_map.max_block_pairs, out_channels)
    for block in neighbor_map.blocks:
        block_products = _block_products(feats, block, offset_weights, gathered, products)
        neighbor_sums = F.embedding_bag(
            block.bag_indices, block_products, block.bag_offsets, mode="sum", include_last_offset=True
        )
        out[block.start : block.end] += neighbor_sums
    return out


def _block_products(
    feats: torch.Tensor,
    block: NeighborBlock,
    offset_weights: torch.Tensor,
    gathered: torch.Tensor | None,
    products: torch.Tensor | None,
) -> torch.Tensor:
    """``feats[src] @ W[offset]`` for every pair of ``block``, one GEMM per kernel offset, in ``src`` order."""
    if products is None:
        rows = feats.index_select(0, block.src)
        return torch.cat([rows[begin:end] @ offset_weights[v] for v, begin, end in block.offset_ranges])
    rows = torch.index_select(feats, 0, block.src, out=gathered[: block.num_pairs])
    for v, begin, end in block.offset_ranges:
        torch.mm(rows[begin:end], offset_weights[v], out=products[begin:end])
    return products[: block.num_pairs]


def sparse_submanifold_conv3d(
    feats: torch.Tensor,
    coords: torch.Tensor,
    shape: Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    neighbor_cache: NeighborMap | None = None,
    dilation: int | Sequence[int] = (1, 1, 1),
) -> tuple[torch.Tensor, NeighborMap]:
    """Drop-in for ``flex_gemm.ops.spconv.sparse_submanifold_conv3d``: same arguments, same return convention.

    Args:
        feats (`torch.Tensor`): ``[N, Ci]``.
        coords (`torch.Tensor`): ``[N, 4]`` integer ``(batch, x, y, z)``.
        shape (`Sequence[int]`): ``(B, C, X, Y, Z)``, as TRELLIS.2 passes ``torch.Size([*x.shape, *x.spatial_shape])``.
        weight (`torch.Tensor`): ``[Co, K0, K1, K2, Ci]``.
        bias (`torch.Tensor`, *optional*): ``[Co]``.
        neighbor_cache (`NeighborMap`, *optional*): the map a previous call returned for these coordinates,
            kernel size and dilation; built when None.
        dilation (`int` or `Sequence[int]`, defaults to ``(1, 1, 1)``): per axis.

    Returns:
        `tuple[torch.Tensor, NeighborMap]`: ``[N, Co]`` output and the neighbour map (the one passed in, or the new
        one), which the caller keeps for the next convolution on the same voxel set.
    """
    if len(shape) != 5:
        raise ValueError(
            f"shape must be (B, C, X, Y, Z), got {tuple(shape)}; pass torch.Size([*x.shape, *x.spatial_shape])"
        )
    _check_weight_layout(weight)
    kernel_size = tuple(weight.shape[1:4])
    if neighbor_cache is None:
        neighbor_cache = build_neighbor_map(coords, shape[2:], kernel_size, dilation)
    elif (neighbor_cache.kernel_size, neighbor_cache.dilation) != (kernel_size, _triple(dilation, "dilation")):
        raise ValueError(
            f"neighbor_cache was built for kernel {neighbor_cache.kernel_size} dilation {neighbor_cache.dilation}, "
            f"this convolution has kernel {kernel_size} dilation {_triple(dilation, 'dilation')}; "
            f"cache maps under neighbor_cache_key(kernel_size, dilation)"
        )
    return submanifold_conv3d(feats, neighbor_cache, weight, bias), neighbor_cache


def _find_neighbors(
    coords: torch.Tensor, kernel_size: tuple[int, int, int], dilation: tuple[int, int, int]
) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """(offset index, source rows, output rows) for every non-centre kernel offset.

    A site's neighbour at shift ``s`` has key ``key + s·strides`` whenever it lies inside the bounding box of the
    sites, so one key add, one binary search and one comparison per site and offset find it; per-axis box checks
    exclude shifts that would wrap into another row, another batch item or outside the grid. Only the first half of
    the offsets is searched: offset ``V - 1 - v`` is the opposite shift of ``v``, so its pairs are ``v``'s swapped.
    """
    index = build_voxel_index(coords)
    local = coords.long() - index.origin
    keys = (local * index.strides).sum(dim=1)
    inside = [
        _inside_per_shift(local[:, 1 + axis], index.extent[1 + axis], kernel_size[axis], dilation[axis])
        for axis in range(3)
    ]
    last = index.num_voxels - 1
    num_offsets = kernel_size[0] * kernel_size[1] * kernel_size[2]
    found_pairs = []
    for offset_index, steps in enumerate(itertools.product(*(range(k) for k in kernel_size))):
        if offset_index == num_offsets // 2:
            break
        shifts = [(step - k // 2) * d for step, k, d in zip(steps, kernel_size, dilation, strict=True)]
        query = keys + sum(shift * index.strides[1 + axis] for axis, shift in enumerate(shifts))
        slot = torch.searchsorted(index.sorted_keys, query).clamp_max_(last)
        found = index.sorted_keys[slot] == query
        for axis, shift in enumerate(shifts):
            if shift != 0:
                found &= inside[axis][shift]
        dst = found.nonzero().squeeze(1)
        src = index.order[slot[dst]]
        found_pairs += [(offset_index, src, dst), (num_offsets - 1 - offset_index, dst, src)]
    return found_pairs


def _inside_per_shift(column: torch.Tensor, extent: torch.Tensor, size: int, step: int) -> dict[int, torch.Tensor]:
    """For each non-zero shift of one axis, whether ``column + shift`` stays inside ``[0, extent)``."""
    shifts = [(i - size // 2) * step for i in range(size)]
    return {shift: (column + shift >= 0) & (column + shift < extent) for shift in shifts if shift != 0}


def _split_into_blocks(
    per_offset: list[tuple[int, torch.Tensor, torch.Tensor]], num_voxels: int, num_offsets: int, rows_per_block: int
) -> tuple[NeighborBlock, ...]:
    """Regroup the pairs by block of output rows: by offset for the GEMMs, by output row for the bag-sums.

    Block ``b`` holds the pairs whose output row is in ``[b·R, (b+1)·R)``. Sorted either way, a block's pairs are
    preceded by the pairs of all earlier rows, so both orders cut into blocks at the same positions. Both sort keys
    are unique (an output row has at most one pair per offset), so the orders are fully determined.
    """
    src = torch.cat([src for _, src, _ in per_offset])
    dst = torch.cat([dst for _, _, dst in per_offset])
    offset_ids = torch.cat([torch.full_like(dst, offset_index) for offset_index, _, dst in per_offset])
    group = torch.div(dst, rows_per_block, rounding_mode="floor") * num_offsets + offset_ids
    by_group = torch.sort(group * num_voxels + dst).indices  # (block, offset, output row)
    src, dst, group, offset_ids = src[by_group], dst[by_group], group[by_group], offset_ids[by_group]
    by_row = torch.sort(dst * num_offsets + offset_ids).indices  # (output row, offset): a fixed summation order
    row_pointer = torch.cat([dst.new_zeros(1), torch.bincount(dst, minlength=num_voxels).cumsum(0)])
    group_ids, group_sizes = torch.unique_consecutive(group, return_counts=True)

    ranges_per_block: dict[int, list[tuple[int, int, int]]] = {}
    position = 0
    for group_id, size in zip(group_ids.tolist(), group_sizes.tolist(), strict=True):
        block, offset_index = divmod(group_id, num_offsets)
        ranges_per_block.setdefault(block, []).append((offset_index, position, position + size))
        position += size

    blocks = []
    for block, ranges in ranges_per_block.items():
        start, end = block * rows_per_block, min((block + 1) * rows_per_block, num_voxels)
        pair_start, pair_end = ranges[0][1], ranges[-1][2]
        blocks.append(
            NeighborBlock(
                start=start,
                end=end,
                src=src[pair_start:pair_end].int(),
                offset_ranges=tuple((v, begin - pair_start, stop - pair_start) for v, begin, stop in ranges),
                bag_indices=(by_row[pair_start:pair_end] - pair_start).int(),
                bag_offsets=(row_pointer[start : end + 1] - pair_start).int(),
            )
        )
    return tuple(blocks)


def _triple(value: int | Sequence[int], name: str) -> tuple[int, int, int]:
    values = (value,) * 3 if isinstance(value, int) else tuple(int(v) for v in value)
    if len(values) != 3:
        raise ValueError(f"{name} must be an int or 3 ints (x, y, z), got {value!r}")
    return values


def _check_kernel(kernel_size: tuple[int, int, int], dilation: tuple[int, int, int]) -> None:
    if any(k < 1 or k % 2 == 0 for k in kernel_size) or any(d < 1 for d in dilation):
        raise ValueError(
            f"submanifold convolution needs odd kernel sizes and dilations >= 1, got kernel_size {kernel_size} "
            f"dilation {dilation}; TRELLIS.2 uses 3x3x3 with dilation 1"
        )


def _check_coords(coords: torch.Tensor, spatial_shape: Sequence[int]) -> None:
    """Reject coordinates that would alias in the key space instead of silently mixing sites (one host sync)."""
    if coords.dim() != 2 or coords.shape[1] != 4 or coords.is_floating_point():
        raise ValueError(
            f"coords must be an [N, 4] integer tensor of (batch, x, y, z), got shape {tuple(coords.shape)} "
            f"dtype {coords.dtype}; pass SparseTensor.coords"
        )
    if len(spatial_shape) != 3:
        raise ValueError(f"spatial_shape must be (X, Y, Z), got {tuple(spatial_shape)}")
    if coords.shape[0] >= 2**31:
        raise ValueError(f"at most 2**31 - 1 sites are supported (int32 pair indices), got {coords.shape[0]}")
    grid = torch.tensor(list(spatial_shape), device=coords.device)
    if coords.shape[0] > 0 and bool((coords < 0).any() | (coords[:, 1:] >= grid).any()):
        raise ValueError(
            f"coords must satisfy batch >= 0 and 0 <= (x, y, z) < spatial_shape {tuple(spatial_shape)}, got minimum "
            f"{coords.amin(dim=0).tolist()} and maximum {coords.amax(dim=0).tolist()}; pass the grid's spatial shape"
        )


def _check_weight_layout(weight: torch.Tensor, kernel_size: tuple[int, int, int] | None = None) -> None:
    if weight.dim() != 5 or (kernel_size is not None and tuple(weight.shape[1:4]) != kernel_size):
        expected = "" if kernel_size is None else f" with (K0, K1, K2) = {kernel_size} (the neighbour map's kernel)"
        raise ValueError(
            f"weight must be [Co, K0, K1, K2, Ci]{expected}, got shape {tuple(weight.shape)}; TRELLIS.2 checkpoints "
            "store SparseConv3d weights this way (the dense F.conv3d weight is weight.permute(0, 4, 1, 2, 3))"
        )


def _check_conv_inputs(
    feats: torch.Tensor, neighbor_map: NeighborMap, weight: torch.Tensor, bias: torch.Tensor | None
) -> None:
    _check_weight_layout(weight, neighbor_map.kernel_size)
    if feats.dim() != 2 or feats.shape != (neighbor_map.num_voxels, weight.shape[-1]):
        raise ValueError(
            f"feats must be [N, Ci] = [{neighbor_map.num_voxels}, {weight.shape[-1]}] (sites of the neighbour map, "
            f"the weight's last dim), got {tuple(feats.shape)}"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [Co] = [{weight.shape[0]}], got {tuple(bias.shape)}")
