"""Sparse renormalised trilinear sampling against a per-point brute force, and the voxel lookup it is built on.

The brute force transcribes FlexGEMM's CUDA kernel (``flex_gemm/kernels/cuda/grid_sample/grid_sample.cu``,
trilinear neighbour map and weights) point by point in float64 with a dict of coordinates.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from trellis2_npu.geometry import grid_sample_cpu
from trellis2_npu.geometry.grid_sample_cpu import grid_sample_3d_cpu
from trellis2_npu.grid_sample import grid_sample_3d
from trellis2_npu.voxel_lookup import NOT_FOUND, build_voxel_index, lookup_voxel_pairs, lookup_voxels


def brute_force_sample(feats, coords, grid_whd, grid):
    """``[B, L, C]`` float64: for each point, the 8 voxels around floor(q - 0.5), weights renormalised."""
    table = {}
    for row, key in enumerate(map(tuple, coords.tolist())):
        table.setdefault(key, row)
    values = feats.double().tolist()
    num_items, num_points, channels = grid.shape[0], grid.shape[1], feats.shape[1]
    out = torch.zeros(num_items, num_points, channels, dtype=torch.float64)
    for b, points in enumerate(grid.double().tolist()):
        for p, q in enumerate(points):
            base = [math.floor(v - 0.5) for v in q]
            total, acc = 0.0, [0.0] * channels
            for i in range(8):
                corner = (base[0] + (i & 1), base[1] + (i >> 1 & 1), base[2] + (i >> 2 & 1))
                if not all(0 <= c < n for c, n in zip(corner, grid_whd, strict=True)) or (b, *corner) not in table:
                    continue
                w = 1.0
                for c, v in zip(corner, q, strict=True):
                    w *= 1 - abs(v - c - 0.5)
                total += w
                acc = [a + w * f for a, f in zip(acc, values[table[(b, *corner)]], strict=True)]
            out[b, p] = torch.tensor(acc, dtype=torch.float64) / max(total, 1e-12)
    return out


def _sparse_grid(seed: int, size: int = 6, items: int = 2, channels: int = 3, occupancy: float = 0.5):
    """Random voxels per batch item (different sets), float64 features, coords ``[N, 4]`` int32 shuffled."""
    gen = torch.Generator().manual_seed(seed)
    dense = torch.rand(items, size, size, size, generator=gen) < occupancy
    coords = dense.nonzero().int()
    coords = coords[torch.randperm(coords.shape[0], generator=gen)]
    feats = torch.randn(coords.shape[0], channels, generator=gen, dtype=torch.float64)
    return feats, coords, gen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_queries_match_brute_force(seed):
    size = 6
    feats, coords, gen = _sparse_grid(seed, size)
    grid = torch.rand(2, 300, 3, generator=gen, dtype=torch.float64) * (size + 2) - 1  # also outside the grid
    shape = torch.Size([1, feats.shape[1], size, size, size])
    out = grid_sample_3d(feats, coords, shape, grid, mode="trilinear")
    assert out.shape == (2, 300, feats.shape[1]) and out.dtype == torch.float64
    torch.testing.assert_close(out, brute_force_sample(feats, coords, (size,) * 3, grid), rtol=0, atol=1e-12)
    chunked = grid_sample_3d(feats, coords, shape, grid, chunk_size=7)  # chunk borders inside a batch item
    torch.testing.assert_close(chunked, out, rtol=0, atol=0)


def _float32_tolerance(feats):
    """A sample is a convex combination of at most 8 features: float32 weights and sums round each of the ~16
    products and additions by one unit in the last place of the largest feature at most."""
    return 16 * torch.finfo(torch.float32).eps * float(feats.abs().max())


@pytest.mark.parametrize("seed", [0, 1])
def test_compiled_cpu_sampling_matches_brute_force_and_the_torch_path(seed, monkeypatch):
    """The numba kernel against the float64 brute force and against the tensor path in float32 (the two sum the
    8 corners in different orders), with duplicate voxel rows (the first wins), queries outside the grid, two
    batch items and chunk borders inside an item (each query is computed alone: chunking changes no bit)."""
    size = 6
    feats, coords, gen = _sparse_grid(seed, size)
    coords = torch.cat([coords, coords[:5]])  # duplicate rows with other features: the first rows win
    feats = torch.cat([feats, torch.randn(5, feats.shape[1], generator=gen, dtype=torch.float64)]).float()
    grid = (torch.rand(2, 300, 3, generator=gen) * (size + 2) - 1).float()
    shape = torch.Size([1, feats.shape[1], size, size, size])
    out = grid_sample_3d_cpu(feats, coords, shape, grid)
    assert out.shape == (2, 300, feats.shape[1]) and out.dtype == torch.float32
    atol = _float32_tolerance(feats)
    torch.testing.assert_close(out.double(), brute_force_sample(feats, coords, (size,) * 3, grid), rtol=0, atol=atol)
    torch.testing.assert_close(out, grid_sample_3d(feats, coords, shape, grid), rtol=0, atol=atol)
    monkeypatch.setattr(grid_sample_cpu, "QUERIES_PER_TASK", 7)
    assert torch.equal(grid_sample_3d_cpu(feats, coords, shape, grid), out)


def test_compiled_cpu_sampling_of_a_sparse_wide_box_searches_every_key():
    """Voxels far apart (more (batch, x, y) columns than COLUMNS_PER_VOXEL allows): one column of every key."""
    gen = torch.Generator().manual_seed(5)
    corners = torch.randint(0, 4000, (30, 3), generator=gen)
    coords = (corners[:, None] + torch.tensor(list(itertools.product(range(2), repeat=3)))).reshape(-1, 3)
    coords = torch.cat([torch.zeros_like(coords[:, :1]), coords], dim=1).int()
    feats = torch.randn(len(coords), 2, generator=gen)
    grid = (corners[:, None].float() + torch.rand(30, 20, 3, generator=gen) * 2).reshape(1, -1, 3)
    out = grid_sample_3d_cpu(feats, coords, (4001,) * 3, grid)
    torch.testing.assert_close(
        out.double(), brute_force_sample(feats, coords, (4001,) * 3, grid), rtol=0, atol=_float32_tolerance(feats)
    )
    assert out.abs().amax(dim=2).gt(0).all()  # every query sits inside its block of 8 voxels


def test_compiled_cpu_sampling_takes_float32_cpu_tensors_only():
    feats, coords, shape = _two_voxels()
    grid = torch.zeros(1, 1, 3)
    assert not grid_sample_cpu.applies(feats, grid) and grid_sample_cpu.applies(feats.float(), grid)
    with pytest.raises(ValueError, match="float32 CPU"):
        grid_sample_3d_cpu(feats, coords, shape, grid)
    assert torch.equal(grid_sample_3d_cpu(feats.float()[:0], coords[:0], shape, grid), torch.zeros(1, 1, 2))


def _two_voxels():
    """Voxels (0,0,0) = [1, 10] and (1,0,0) = [3, 30] of a 4³ grid, batch 0."""
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.int32)
    feats = torch.tensor([[1.0, 10.0], [3.0, 30.0]], dtype=torch.float64)
    return feats, coords, (4, 4, 4)


def test_weights_are_renormalised_over_present_voxels():
    feats, coords, shape = _two_voxels()
    # (1, 1, 0.5): the 4 voxels x ∈ {0, 1}, y ∈ {0, 1} at z = 0 each weigh 1/4; only the two y = 0 ones exist,
    # so each gets 1/2 (F.grid_sample-style zero padding would give 1/4).
    grid = torch.tensor([[[1.0, 1.0, 0.5], [0.75, 1.0, 0.5]]], dtype=torch.float64)
    out = grid_sample_3d(feats, coords, shape, grid)
    # (0.75, 1, 0.5): x weights 3/4 and 1/4, halved by y; renormalised back to 3/4 and 1/4.
    expected = torch.tensor([[[2.0, 20.0], [0.75 * 1 + 0.25 * 3, 0.75 * 10 + 0.25 * 30]]], dtype=torch.float64)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_no_present_neighbour_samples_zero():
    feats, coords, shape = _two_voxels()
    grid = torch.tensor([[[3.2, 3.1, 2.9], [-5.0, 0.5, 0.5], [0.5, 2.5, 0.5]]], dtype=torch.float64)
    assert torch.equal(grid_sample_3d(feats, coords, shape, grid), torch.zeros(1, 3, 2, dtype=torch.float64))


def test_voxel_centres_return_the_voxel_value():
    feats, coords, _ = _sparse_grid(3, size=5, items=1)
    centres = (coords[:, 1:].double() + 0.5).unsqueeze(0)
    out = grid_sample_3d(feats, coords, (5, 5, 5), centres)
    assert torch.equal(out[0], feats)
    # FlexGEMM quirk kept: at the centre of an absent voxel its neighbours weigh exactly 0, so the sample is 0.
    feats, coords, shape = _two_voxels()
    out = grid_sample_3d(feats, coords, shape, torch.tensor([[[2.5, 0.5, 0.5]]], dtype=torch.float64))
    assert torch.equal(out, torch.zeros(1, 1, 2, dtype=torch.float64))


def test_linear_field_is_reproduced_inside_a_full_block():
    size = 5
    coords = torch.tensor([(0, *c) for c in itertools.product(range(size), repeat=3)], dtype=torch.int32)
    slope, offset = torch.tensor([[0.7, -1.3], [2.1, 0.4], [-0.5, 3.0]], dtype=torch.float64), torch.tensor([1.5, -2])
    feats = (coords[:, 1:].double() + 0.5) @ slope + offset
    gen = torch.Generator().manual_seed(0)
    grid = 0.5 + torch.rand(1, 500, 3, generator=gen, dtype=torch.float64) * (size - 1)  # between outer centres
    out = grid_sample_3d(feats, coords, (size,) * 3, grid)
    torch.testing.assert_close(out[0], grid[0] @ slope + offset, rtol=0, atol=1e-12)


def _dense_grid_sample(feats, coords, size, grid):
    """F.grid_sample on the densified grid, align_corners=False: the same voxel-centre convention, zero holes."""
    volume = torch.zeros(1, feats.shape[1], size, size, size, dtype=feats.dtype)
    x, y, z = coords[:, 1].long(), coords[:, 2].long(), coords[:, 3].long()
    volume[0, :, z, y, x] = feats.T  # grid_sample reads (x, y, z) as (W, H, D)
    normalised = (grid * 2 / size - 1).reshape(1, 1, 1, -1, 3)
    out = F.grid_sample(volume, normalised, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.reshape(feats.shape[1], -1).T.unsqueeze(0)


def test_differs_from_f_grid_sample_only_where_voxels_are_missing():
    size = 5
    coords = torch.tensor([(0, *c) for c in itertools.product(range(size), repeat=3)], dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    feats = torch.randn(coords.shape[0], 2, generator=gen, dtype=torch.float64)
    grid = 0.5 + torch.rand(1, 200, 3, generator=gen, dtype=torch.float64) * (size - 1)
    full = grid_sample_3d(feats, coords, (size,) * 3, grid)
    torch.testing.assert_close(full, _dense_grid_sample(feats, coords, size, grid), rtol=0, atol=1e-12)
    holes = torch.rand(coords.shape[0], generator=gen) < 0.7
    sparse = grid_sample_3d(feats[holes], coords[holes], (size,) * 3, grid)
    dense = _dense_grid_sample(feats[holes], coords[holes], size, grid)
    assert (sparse - dense).abs().max() > 0.1  # F.grid_sample counts holes as zeros instead of renormalising


def test_batch_items_only_see_their_own_voxels():
    feats, coords, shape = _two_voxels()
    coords = torch.cat([coords, torch.tensor([[1, 0, 0, 0]], dtype=torch.int32)])
    feats = torch.cat([feats, torch.tensor([[-7.0, -70.0]], dtype=torch.float64)])
    grid = torch.tensor([[[1.0, 0.5, 0.5]], [[1.0, 0.5, 0.5]]], dtype=torch.float64)
    out = grid_sample_3d(feats, coords, shape, grid)
    assert out[0, 0].tolist() == [2.0, 20.0] and out[1, 0].tolist() == [-7.0, -70.0]


def test_voxels_outside_the_shape_are_not_sampled():
    feats, coords, _ = _two_voxels()
    grid = torch.tensor([[[1.0, 0.5, 0.5]]], dtype=torch.float64)
    out = grid_sample_3d(feats, coords, torch.Size([1, 2, 1, 4, 4]), grid)  # W = 1: voxel x = 1 is outside
    assert out[0, 0].tolist() == [1.0, 10.0]


def test_float32_and_float16_inputs_keep_the_feature_dtype():
    feats, coords, gen = _sparse_grid(4, items=1)
    grid = torch.rand(1, 100, 3, generator=gen) * 6
    reference = grid_sample_3d(feats, coords, (6, 6, 6), grid.double())
    for dtype, atol in ((torch.float32, 1e-5), (torch.float16, 1e-2)):
        out = grid_sample_3d(feats.to(dtype), coords, (6, 6, 6), grid)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), reference, rtol=0, atol=atol)


def test_rejected_arguments():
    feats, coords, shape = _two_voxels()
    grid = torch.zeros(1, 1, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="mode='trilinear'"):
        grid_sample_3d(feats, coords, shape, grid, mode="nearest")
    with pytest.raises(ValueError, match="zero batch column"):
        grid_sample_3d(feats, coords[:, 1:], shape, grid)
    with pytest.raises(ValueError, match="reshape"):
        grid_sample_3d(feats, coords, shape, grid[0])
    assert grid_sample_3d(feats, coords, shape, grid[:, :0]).shape == (1, 0, 2)


def test_lookup_matches_a_dict_with_batch_ids_and_duplicates():
    gen = torch.Generator().manual_seed(0)
    coords = torch.randint(-3, 4, (200, 4), generator=gen)  # negative coordinates and duplicate rows included
    queries = torch.randint(-5, 6, (50, 8, 4), generator=gen)
    positions, found = lookup_voxels(build_voxel_index(coords), queries)
    table = {}
    for row, key in enumerate(map(tuple, coords.tolist())):
        table.setdefault(key, row)  # the first of duplicate rows
    expected = [[table.get(tuple(q), NOT_FOUND) for q in group] for group in queries.tolist()]
    assert positions.tolist() == expected
    assert torch.equal(found, positions != NOT_FOUND)
    positions, found = lookup_voxels(build_voxel_index(coords[:0]), queries)
    assert not found.any() and (positions == NOT_FOUND).all()


@pytest.mark.parametrize("duplicates", [False, True])
def test_lookup_pairs_find_each_row_and_the_next_one_along_z_as_a_dict_does(duplicates):
    """One search per pair: the neighbour's slot is derived, so check it where that is delicate: queries below,
    inside and above the box along z (the neighbour of z = min - 1 is the first row, of z = max it is outside),
    other columns' keys adjacent to the query's, and duplicate rows (a separate search)."""
    gen = torch.Generator().manual_seed(1)
    coords = torch.randint(-2, 3, (90, 4), generator=gen)
    coords = coords if duplicates else coords.unique(dim=0)[torch.randperm(len(coords.unique(dim=0)), generator=gen)]
    index = build_voxel_index(coords)
    assert index.has_duplicates == duplicates
    queries = torch.randint(-4, 5, (60, 4, 4), generator=gen)
    table = {}
    for row, key in enumerate(map(tuple, coords.tolist())):
        table.setdefault(key, row)
    positions, found = lookup_voxel_pairs(index, queries)
    expected = [
        [[table.get((*q[:3], q[3] + step), NOT_FOUND) for step in (0, 1)] for q in group] for group in queries.tolist()
    ]
    assert positions.tolist() == expected
    assert torch.equal(found, positions != NOT_FOUND)
    positions, found = lookup_voxel_pairs(build_voxel_index(coords[:0]), queries)
    assert not found.any() and (positions == NOT_FOUND).all()
    with pytest.raises(ValueError, match="columns"):
        lookup_voxel_pairs(index, queries[..., 1:])
