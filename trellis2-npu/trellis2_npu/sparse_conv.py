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
- the neighbour map is found without a CUDA hash table: an int32 array over the sites' bounding box widened by the
  kernel's reach (site row per cell; one add and one gather per site and offset) when that box has at most
  ``max(DENSE_LOOKUP_MIN_CELLS, DENSE_LOOKUP_CELLS_PER_SITE · N)`` cells and fewer than 2**31 (int32 keys), else
  sorted int64 keys and ``torch.searchsorted`` (:mod:`trellis2_npu.voxel_lookup`); it is stored as (input row →
  output row) pairs per kernel offset, without the centre, built ``MAP_ROWS_PER_TASK`` rows at a time with one
  compaction for all their blocks;
- the product is gather → one GEMM per kernel offset → a per-output-row sum of the products with
  ``F.embedding_bag`` (a CSR segment sum), block by block of output rows. FlexGEMM's torch path
  (``explicit_gemm``) builds an ``[N, K³·Ci]`` im2col instead, which on a surface spends most of its FLOPs and
  memory on absent neighbours (a sphere shell has ~10.5 of 27); scattering the products with ``index_add_``
  was slower per row than the bag-sum on the CPU (``benchmarks/sparse_conv.py``);
- on the CPU a block is ``CPU_ROWS_PER_BLOCK`` output rows, so that a block's gathered rows and products stay in
  cache; elsewhere blocks are large (few kernel launches) and only bound the two buffers' memory. The map costs
  8 bytes per pair (int32) plus 4 per site; building it, the dense array (the search: a ``[K³, N]`` int32 table)
  plus a few tens of bytes per kernel offset and row of each running task;
- only odd kernel sizes (centred kernels, all TRELLIS.2 uses) and stride 1;
- on an NPU with Ascend's DrivingSDK (``mx_driving``) installed, :func:`sparse_submanifold_conv3d` hands 3×3×3,
  dilation-1 float32/float16 convolutions to its ``SubMConv3d`` kernel through ``deliverykit.ops``
  (``"subm_conv3d"``; ``DELIVERYKIT_DISABLE_KERNELS=subm_conv3d`` keeps this path): the returned cache is then a
  :class:`KernelNeighbors` holding that kernel's own neighbour offsets.

CPU threads (``cpu_threads``): by default (``"workers"``) a convolution's blocks are spread over
``torch.get_num_threads()`` worker threads that each run their ops on one intra-op thread, taking the next block
when done; the neighbour map's tasks (the search's lookups, one per kernel offset, then rows) are shared out the
same way. torch's own intra-op parallelism (``"intra-op"``: one block after the other, every op split over the
OpenMP team) opens ~30 short parallel regions per block; when another process keeps a core busy, GNU OpenMP's
spin-waiting threads lose their scheduler slices to it and every region waits for one (many times slower than one
thread: ``benchmarks/sparse_conv.py``, "one core busy"; ``OMP_WAIT_POLICY=passive`` removes it, but libgomp reads
it only at start-up). The
workers open no parallel region and share the blocks dynamically, so a busy core slows only the worker on it. Both
policies compute every output row with the same ops in the same order; the GEMMs may differ in float rounding
between thread counts.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from deliverykit import ops
from deliverykit.cpu_tasks import POLICIES as CPU_THREAD_POLICIES
from deliverykit.cpu_tasks import TaskRunner, task_runner

from .voxel_lookup import build_voxel_index

CPU_ROWS_PER_BLOCK = 2048  # output rows per block on the CPU: ~20k pairs, whose products stay in cache
ACCELERATOR_ROWS_PER_BLOCK = 1 << 16  # elsewhere: few large kernels; buffers ≤ 27·65536 rows even on dense sets
DENSE_LOOKUP_MIN_CELLS = 1 << 24  # a bounding box this small is looked up in a dense int32 array (≤ 64 MiB) ...
DENSE_LOOKUP_CELLS_PER_SITE = 64  # ... as is one with at most this many cells per site (≤ 256 bytes per site)
MAP_ROWS_PER_TASK = 1 << 14  # neighbour-map rows per task (27·16k candidates): faster than 8k or 32k on the CPU
CPU_THREADS_ENV = "TRELLIS2_SPARSE_CONV_CPU_THREADS"  # overrides the default policy, "workers"


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


@dataclass(frozen=True, eq=False)
class KernelNeighbors:
    """What a device kernel keeps for one voxel set and kernel, in place of a :class:`NeighborMap` (mx_driving's
    neighbour offsets, filled by its first call): upstream caches and passes it back like the map."""

    kernel_size: tuple[int, int, int]
    dilation: tuple[int, int, int]
    state: dict = field(default_factory=dict)


def uses_device_kernel(feats: torch.Tensor, kernel_size: Sequence[int], dilation: Sequence[int]) -> bool:
    """Whether :func:`sparse_submanifold_conv3d` runs ``deliverykit.ops``' ``subm_conv3d`` for these inputs: the
    constraints DrivingSDK documents for its SubMConv3d (kernel 3, dilation 1) and the 910B kernel's dtypes."""
    return (
        tuple(kernel_size) == (3, 3, 3)
        and tuple(dilation) == (1, 1, 1)
        and feats.dtype in ops.SUBM_CONV_DTYPES
        and ops.uses_npu_kernel("subm_conv3d", feats.device)
    )


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
    *,
    cpu_threads: str | None = None,
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
        cpu_threads (`str`, *optional*): ``"workers"`` or ``"intra-op"`` (see the module docstring); defaults to
            ``$TRELLIS2_SPARSE_CONV_CPU_THREADS``, else ``"workers"``. Ignored off the CPU. The map is the same.

    Costs a few host syncs (input checks, two per task of rows); the convolutions that reuse the map cost none.
    """
    kernel_size = _triple(kernel_size, "kernel_size")
    dilation = _triple(dilation, "dilation")
    _check_kernel(kernel_size, dilation)
    low, high = _check_coords(coords, spatial_shape)
    policy = _cpu_thread_policy(cpu_threads)
    if rows_per_block is None:
        rows_per_block = CPU_ROWS_PER_BLOCK if coords.device.type == "cpu" else ACCELERATOR_ROWS_PER_BLOCK
    num_voxels = coords.shape[0]
    if num_voxels == 0 or kernel_size == (1, 1, 1):
        return NeighborMap(kernel_size, dilation, num_voxels, ())

    run = _task_runner(coords.device, policy)
    origin, sides = _widened_box(low, high, kernel_size, dilation)
    lookup: _DenseNeighbors | _SearchedNeighbors
    if _fits_dense_array(sides, num_voxels):
        # allocated on the calling thread: a large block that a worker thread frees tends to go back to the kernel,
        # and the next build page-faults all of it in again (~6k faults for 24 MB, measured up to 2x the build)
        cell_rows = torch.empty(math.prod(sides), dtype=torch.int32, device=coords.device)
        (lookup,) = run(lambda _: _DenseNeighbors(coords, origin, sides, cell_rows, kernel_size, dilation), [None])
    else:
        (lookup,) = run(lambda _: _SearchedNeighbors(coords, kernel_size, dilation), [None])
        run(lookup.fill_offset, lookup.offsets)
    rows_per_task = rows_per_block * max(1, MAP_ROWS_PER_TASK // rows_per_block)
    spans = [(start, min(start + rows_per_task, num_voxels)) for start in range(0, num_voxels, rows_per_task)]
    found = run(lambda span: _blocks_from_neighbors(lookup.neighbors(*span, rows_per_block), *span), spans)
    return NeighborMap(kernel_size, dilation, num_voxels, tuple(itertools.chain.from_iterable(found)))


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
    *,
    cpu_threads: str | None = None,
) -> torch.Tensor:
    """Submanifold sparse convolution of ``feats`` over the voxel set that ``neighbor_map`` describes.

    Args:
        feats (`torch.Tensor`): ``[N, Ci]``, row ``i`` belongs to site ``coords[i]``.
        neighbor_map (`NeighborMap`): from :func:`build_neighbor_map` for these sites.
        weight (`torch.Tensor`): ``[Co, K0, K1, K2, Ci]``, the TRELLIS.2 / FlexGEMM checkpoint layout.
        bias (`torch.Tensor`, *optional*): ``[Co]``.
        cpu_threads (`str`, *optional*): ``"workers"`` or ``"intra-op"`` (see the module docstring); defaults to
            ``$TRELLIS2_SPARSE_CONV_CPU_THREADS``, else ``"workers"``. Ignored off the CPU and when autograd records.

    Returns:
        `torch.Tensor`: ``[N, Co]``, same site order as ``feats``.
    """
    _check_conv_inputs(feats, neighbor_map, weight, bias)
    policy = _cpu_thread_policy(cpu_threads)
    out_channels, in_channels = weight.shape[0], weight.shape[-1]
    num_offsets = weight.shape[1] * weight.shape[2] * weight.shape[3]
    # [V, Ci, Co]: one right-hand GEMM operand per kernel offset (a copy of the weight, tiny next to the features)
    offset_weights = weight.reshape(out_channels, num_offsets, in_channels).permute(1, 2, 0).contiguous()
    if torch.is_grad_enabled() and (feats.requires_grad or weight.requires_grad or _requires_grad(bias)):
        return _differentiable_conv(feats, neighbor_map, offset_weights, bias)
    out = feats.new_empty(feats.shape[0], out_channels)
    buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per thread, reused across its blocks
    inference = torch.is_inference_mode_enabled()

    per_offset = offset_weights.unbind(0)  # views, made once: fewer Python-level ops per block (the GIL)

    def convolve_rows(part: tuple[int, int, NeighborBlock | None]) -> None:
        with torch.inference_mode() if inference else torch.no_grad():  # grad modes are per thread
            _convolve_rows(feats, per_offset, bias, out, part, buffers, neighbor_map.max_block_pairs)

    _task_runner(feats.device, policy)(convolve_rows, _row_parts(neighbor_map))
    return out


def _convolve_rows(
    feats: torch.Tensor,
    offset_weights: Sequence[torch.Tensor],
    bias: torch.Tensor | None,
    out: torch.Tensor,
    part: tuple[int, int, NeighborBlock | None],
    buffers: dict[int, tuple[torch.Tensor, torch.Tensor]],
    max_block_pairs: int,
) -> None:
    """``out[start:end]`` of ``part = (start, end, block)``: the centre GEMM (+ bias), then the block's gather →
    GEMM per offset → bag-sum."""
    start, end, block = part
    centre = offset_weights[len(offset_weights) // 2]
    rows_out = out[start:end]
    if bias is None:
        torch.mm(feats[start:end], centre, out=rows_out)
    else:
        torch.addmm(bias, feats[start:end], centre, out=rows_out)
    if block is None:
        return
    thread = threading.get_ident()
    if thread not in buffers:
        buffers[thread] = (
            feats.new_empty(max_block_pairs, feats.shape[1]),
            feats.new_empty(max_block_pairs, out.shape[1]),
        )
    gathered, products = buffers[thread]
    rows = torch.index_select(feats, 0, block.src, out=gathered[: block.num_pairs])
    products = products[: block.num_pairs]
    sizes = [stop - begin for _, begin, stop in block.offset_ranges]  # consecutive ranges from 0
    for (v, _, _), lhs, result in zip(block.offset_ranges, rows.split(sizes), products.split(sizes), strict=True):
        torch.mm(lhs, offset_weights[v], out=result)
    rows_out += F.embedding_bag(block.bag_indices, products, block.bag_offsets, mode="sum", include_last_offset=True)


def _differentiable_conv(
    feats: torch.Tensor, neighbor_map: NeighborMap, offset_weights: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The same sums with ops that autograd records (no ``out=`` buffers), on the calling thread."""
    centre = offset_weights[offset_weights.shape[0] // 2]
    out = feats @ centre if bias is None else torch.addmm(bias, feats, centre)
    for block in neighbor_map.blocks:
        rows = feats.index_select(0, block.src)
        products = torch.cat([rows[begin:end] @ offset_weights[v] for v, begin, end in block.offset_ranges])
        neighbor_sums = F.embedding_bag(
            block.bag_indices, products, block.bag_offsets, mode="sum", include_last_offset=True
        )
        out[block.start : block.end] += neighbor_sums
    return out


def _row_parts(neighbor_map: NeighborMap) -> list[tuple[int, int, NeighborBlock | None]]:
    """``(start, end, block)`` covering every output row once: each block, and the rows between blocks alone."""
    parts: list[tuple[int, int, NeighborBlock | None]] = []
    position = 0
    for block in neighbor_map.blocks:
        if block.start > position:
            parts.append((position, block.start, None))
        parts.append((block.start, block.end, block))
        position = block.end
    if position < neighbor_map.num_voxels:
        parts.append((position, neighbor_map.num_voxels, None))
    return parts


def _requires_grad(tensor: torch.Tensor | None) -> bool:
    return tensor is not None and tensor.requires_grad


def sparse_submanifold_conv3d(
    feats: torch.Tensor,
    coords: torch.Tensor,
    shape: Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    neighbor_cache: NeighborMap | KernelNeighbors | None = None,
    dilation: int | Sequence[int] = (1, 1, 1),
) -> tuple[torch.Tensor, NeighborMap | KernelNeighbors]:
    """Drop-in for ``flex_gemm.ops.spconv.sparse_submanifold_conv3d``: same arguments, same return convention.

    Args:
        feats (`torch.Tensor`): ``[N, Ci]``.
        coords (`torch.Tensor`): ``[N, 4]`` integer ``(batch, x, y, z)``.
        shape (`Sequence[int]`): ``(B, C, X, Y, Z)``, as TRELLIS.2 passes ``torch.Size([*x.shape, *x.spatial_shape])``.
        weight (`torch.Tensor`): ``[Co, K0, K1, K2, Ci]``.
        bias (`torch.Tensor`, *optional*): ``[Co]``.
        neighbor_cache (`NeighborMap` or `KernelNeighbors`, *optional*): what a previous call returned for these
            coordinates, kernel size and dilation; built when None.
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
    dilation = _triple(dilation, "dilation")
    if neighbor_cache is None:
        if uses_device_kernel(feats, kernel_size, dilation):
            neighbor_cache = KernelNeighbors(kernel_size, dilation)
        else:
            neighbor_cache = build_neighbor_map(coords, shape[2:], kernel_size, dilation)
    elif (neighbor_cache.kernel_size, neighbor_cache.dilation) != (kernel_size, dilation):
        raise ValueError(
            f"neighbor_cache was built for kernel {neighbor_cache.kernel_size} dilation {neighbor_cache.dilation}, "
            f"this convolution has kernel {kernel_size} dilation {dilation}; "
            f"cache maps under neighbor_cache_key(kernel_size, dilation)"
        )
    if isinstance(neighbor_cache, KernelNeighbors):
        kernel = ops.select("subm_conv3d", feats.device)
        return kernel(feats, coords, shape[2:], weight, bias, cache=neighbor_cache.state), neighbor_cache
    return submanifold_conv3d(feats, neighbor_cache, weight, bias), neighbor_cache


def _widened_box(
    low: list[int], high: list[int], kernel_size: tuple[int, int, int], dilation: tuple[int, int, int]
) -> tuple[list[int], list[int]]:
    """Origin and sides of the sites' bounding box ``[low, high]`` (b, x, y, z), widened by the kernel's reach."""
    reach = [0] + [d * (k // 2) for k, d in zip(kernel_size, dilation, strict=True)]  # no shift along the batch
    origin = [value - r for value, r in zip(low, reach, strict=True)]
    return origin, [value + r - start + 1 for value, r, start in zip(high, reach, origin, strict=True)]


def _fits_dense_array(sides: list[int], num_voxels: int) -> bool:
    """Whether the widened box is small enough for :class:`_DenseNeighbors` (and its int32 keys)."""
    cells = math.prod(sides)  # a Python int: no int64 overflow
    return cells < 2**31 and cells <= max(DENSE_LOOKUP_MIN_CELLS, DENSE_LOOKUP_CELLS_PER_SITE * num_voxels)


class _DenseNeighbors:
    """Neighbour rows from ``cell_rows``, an int32 array over the sites' box widened by the kernel's reach per side.

    ``cell_rows[key]`` is the row of the site in that cell, or -1. Thanks to the margin, ``key + shift`` is the
    cell of the neighbour at ``shift`` for every site: inside the array, never wrapping into another row or batch
    item, and empty where the neighbour lies outside the grid. So a lookup is one add and one gather, no bounds
    checks, and keys and indices fit int32 (the array has fewer than 2**31 cells). All offsets of a task's rows
    are gathered at once, offset-major, whose reads stay within a few x-slices of the array.
    """

    def __init__(
        self,
        coords: torch.Tensor,
        origin: list[int],
        sides: list[int],
        cell_rows: torch.Tensor,
        kernel_size: tuple[int, int, int],
        dilation: tuple[int, int, int],
    ):
        device = coords.device
        strides = [sides[1] * sides[2] * sides[3], sides[2] * sides[3], sides[3], 1]  # row-major (b, x, y, z)
        local = coords.long() - torch.tensor(origin, device=device)
        self.keys = (local * torch.tensor(strides, device=device)).sum(dim=1).int()
        self.cell_rows = cell_rows.fill_(-1)  # [prod(sides)] int32
        self.cell_rows[self.keys] = torch.arange(coords.shape[0], dtype=torch.int32, device=device)
        all_steps = itertools.product(*(range(k) for k in kernel_size))
        shifts = [
            sum(
                (step - k // 2) * d * stride
                for step, k, d, stride in zip(steps, kernel_size, dilation, strides[1:], strict=True)
            )
            for steps in all_steps
        ]
        self.shifts = torch.tensor(shifts, dtype=torch.int32, device=device).view(1, -1, 1)

    def neighbors(self, start: int, end: int, rows_per_block: int) -> torch.Tensor:
        """``[B, V, R]`` int32: the input row at offset ``v`` of output row ``start + b·R + r``, or -1 (centre,
        absent, and the rows past ``end`` that fill the last block)."""
        num_rows = end - start
        num_blocks = -(-num_rows // rows_per_block)
        keys = self.keys[start:end]
        if num_rows < num_blocks * rows_per_block:  # any key will do: those rows are cleared below
            keys = torch.cat([keys, keys[:1].expand(num_blocks * rows_per_block - num_rows)])
        cells = self.shifts + keys.view(num_blocks, 1, rows_per_block)
        neighbors = self.cell_rows.index_select(0, cells.view(-1)).view(cells.shape)
        neighbors[:, self.shifts.shape[1] // 2] = -1
        neighbors[-1, :, num_rows - (num_blocks - 1) * rows_per_block :] = -1
        return neighbors


class _SearchedNeighbors:
    """``table`` (``[V, N]`` int32): ``table[v, p]`` is the input row at kernel offset ``v`` of site ``p``, or -1.

    For boxes too large for :class:`_DenseNeighbors`. The centre row is -1. A site's neighbour at shift ``s`` has
    key ``key + s·strides`` whenever it lies inside the bounding box of the sites, so one key add and one binary
    search in the sorted keys per site and offset find it; per-axis box checks exclude shifts that would wrap into
    another row, another batch item or outside the grid. Only the first half of the offsets is searched, since
    offset ``V - 1 - v`` is the opposite shift of ``v`` (its pairs are ``v``'s swapped). :meth:`fill_offset` fills
    the rows of one of :attr:`offsets` (independent tasks).
    """

    def __init__(self, coords: torch.Tensor, kernel_size: tuple[int, int, int], dilation: tuple[int, int, int]):
        self.index = build_voxel_index(coords)
        sides = self.index.extent.tolist()
        self.strides = [sides[1] * sides[2] * sides[3], sides[2] * sides[3], sides[3], 1]  # row-major (b, x, y, z)
        local = coords.long() - self.index.origin
        self.keys = (local * self.index.strides).sum(dim=1)
        self.inside = [
            _inside_per_shift(local[:, 1 + axis], self.index.extent[1 + axis], kernel_size[axis], dilation[axis])
            for axis in range(3)
        ]
        self.num_offsets = kernel_size[0] * kernel_size[1] * kernel_size[2]
        self.table = torch.full((self.num_offsets, coords.shape[0]), -1, dtype=torch.int32, device=coords.device)
        all_steps = itertools.product(*(range(k) for k in kernel_size))
        self.offsets = [
            (offset_index, [(step - k // 2) * d for step, k, d in zip(steps, kernel_size, dilation, strict=True)])
            for offset_index, steps in itertools.islice(enumerate(all_steps), self.num_offsets // 2)
        ]

    def fill_offset(self, offset: tuple[int, list[int]]) -> None:
        offset_index, shifts = offset
        query = self.keys + sum(shift * self.strides[1 + axis] for axis, shift in enumerate(shifts))
        inside_box = functools.reduce(
            torch.logical_and, [self.inside[axis][shift] for axis, shift in enumerate(shifts) if shift != 0]
        )
        sorted_keys = self.index.sorted_keys
        slot = torch.searchsorted(sorted_keys, query).clamp_max_(sorted_keys.shape[0] - 1)
        found = (sorted_keys[slot] == query) & inside_box
        dst = found.nonzero().squeeze(1)
        src = self.index.order[slot[dst]]
        self.table[offset_index, dst] = src.int()
        self.table[self.num_offsets - 1 - offset_index, src] = dst.int()

    def neighbors(self, start: int, end: int, rows_per_block: int) -> torch.Tensor:
        """The rows of ``table`` as :meth:`_DenseNeighbors.neighbors` gives them."""
        num_blocks = -(-(end - start) // rows_per_block)
        rows = F.pad(self.table[:, start:end], (0, num_blocks * rows_per_block - (end - start)), value=-1)
        return rows.view(self.num_offsets, num_blocks, rows_per_block).transpose(0, 1).contiguous()


def _blocks_from_neighbors(neighbors: torch.Tensor, start: int, end: int) -> list[NeighborBlock]:
    """The blocks of output rows ``[start, end)`` that have pairs, from ``neighbors`` (``[B, V, R]``, as
    :meth:`_DenseNeighbors.neighbors` gives them).

    ``src`` lists a block's pairs by (offset, output row), for the GEMMs; ``bag_indices`` lists their positions
    by (output row, offset), a fixed summation order for the bag-sums. All blocks of the task share one
    compaction: a pair's position in ``src`` is a running count of pairs in (offset, row) order within its block,
    its place in the bag order a running count in (block, row, offset) order, and ``bag_indices`` is the first
    scattered to the second.
    """
    num_blocks, num_offsets, rows_per_block = neighbors.shape
    present = neighbors >= 0
    by_offset = present.view(-1).cumsum(0, dtype=torch.int32).view(num_blocks, -1)
    block_starts = torch.cat([by_offset.new_zeros(1), by_offset[:-1, -1]])
    in_block = by_offset - block_starts[:, None]  # (offset, row) order; one flat cumsum is faster than per block
    by_row = present.transpose(1, 2).contiguous().view(-1).cumsum(0, dtype=torch.int32)  # (block, row, offset)
    row_ends = by_row.view(num_blocks, rows_per_block, num_offsets)[:, :, -1]
    bag_offsets = torch.cat([block_starts[:, None], row_ends], dim=1) - block_starts[:, None]
    pairs = present.view(-1).nonzero().squeeze(1)
    src = neighbors.view(-1).index_select(0, pairs)
    position = in_block.view(-1).index_select(0, pairs).sub_(1)
    bag_slot = by_row.view(num_blocks, rows_per_block, num_offsets).transpose(1, 2).reshape(-1).index_select(0, pairs)
    bag_indices = torch.empty_like(position).index_copy_(0, bag_slot.sub_(1).long(), position)
    blocks, begin = [], 0
    for block, offset_ends in enumerate(in_block.view(num_blocks, num_offsets, -1)[:, :, -1].tolist()):
        if offset_ends[-1] == 0:
            continue
        ranges = [(v, b, e) for v, (b, e) in enumerate(itertools.pairwise([0, *offset_ends])) if e > b]
        first = start + block * rows_per_block
        last = min(first + rows_per_block, end)
        blocks.append(
            NeighborBlock(
                start=first,
                end=last,
                src=src[begin : begin + offset_ends[-1]],
                offset_ranges=tuple(ranges),
                bag_indices=bag_indices[begin : begin + offset_ends[-1]],
                bag_offsets=bag_offsets[block, : last - first + 1],
            )
        )
        begin += offset_ends[-1]
    return blocks


def _inside_per_shift(column: torch.Tensor, extent: torch.Tensor, size: int, step: int) -> dict[int, torch.Tensor]:
    """For each non-zero shift of one axis, whether ``column + shift`` stays inside ``[0, extent)``."""
    shifts = [(i - size // 2) * step for i in range(size)]
    return {shift: (column + shift >= 0) & (column + shift < extent) for shift in shifts if shift != 0}


def _cpu_thread_policy(cpu_threads: str | None) -> str:
    policy = cpu_threads or os.environ.get(CPU_THREADS_ENV) or CPU_THREAD_POLICIES[0]
    if policy not in CPU_THREAD_POLICIES:
        source = "cpu_threads" if cpu_threads else f"${CPU_THREADS_ENV}"
        raise ValueError(f"{source} must be one of {', '.join(CPU_THREAD_POLICIES)}, got {policy!r}")
    return policy


def _task_runner(device: torch.device, policy: str) -> TaskRunner:
    """How to run independent tasks: on single-threaded CPU workers, or one after the other on this thread."""
    return task_runner(device, policy)


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


def _check_coords(coords: torch.Tensor, spatial_shape: Sequence[int]) -> tuple[list[int], list[int]]:
    """Reject coordinates that would alias in the key space instead of silently mixing sites (one host sync).

    Returns the per-column minimum and maximum of ``coords`` (empty lists for no sites): the sites' bounding box.
    """
    if coords.dim() != 2 or coords.shape[1] != 4 or coords.is_floating_point():
        raise ValueError(
            f"coords must be an [N, 4] integer tensor of (batch, x, y, z), got shape {tuple(coords.shape)} "
            f"dtype {coords.dtype}; pass SparseTensor.coords"
        )
    if len(spatial_shape) != 3:
        raise ValueError(f"spatial_shape must be (X, Y, Z), got {tuple(spatial_shape)}")
    if coords.shape[0] >= 2**31:
        raise ValueError(f"at most 2**31 - 1 sites are supported (int32 pair indices), got {coords.shape[0]}")
    if coords.shape[0] == 0:
        return [], []
    low, high = coords.amin(dim=0).tolist(), coords.amax(dim=0).tolist()
    if min(low) < 0 or any(value >= size for value, size in zip(high[1:], spatial_shape, strict=True)):
        raise ValueError(
            f"coords must satisfy batch >= 0 and 0 <= (x, y, z) < spatial_shape {tuple(spatial_shape)}, got minimum "
            f"{low} and maximum {high}; pass the grid's spatial shape"
        )
    return low, high


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
