"""Submanifold sparse convolution against a dense ``F.conv3d`` on the densified grid, and against spconv.

The dense reference scatters the features into a zero grid, convolves with the checkpoint weight permuted to
``[Co, Ci, K0, K1, K2]`` and ``padding = dilation·(K//2)``, and reads the active sites back: outside the active
sites the grid is zero, so this is exactly the submanifold convolution. spconv 2.3.8 (a test-only install) is an
independent implementation; its CPU path is only right with one thread (trellis2.md §6). The CPU thread policies
(single-threaded workers, torch's intra-op threads) and the two neighbour lookups (dense array, binary search) are
checked against each other, and the neighbour map against a brute-force Python reference of its definition. On an
NPU with DrivingSDK installed, the 3×3×3 convolutions go to its kernel (``deliverykit.ops``' ``subm_conv3d``): the
routing is checked here with a stand-in kernel, its result against this convolution on an NPU only.
"""

from __future__ import annotations

import itertools
import multiprocessing
import threading

import pytest
import torch
import torch.nn.functional as F

from deliverykit import ops
from deliverykit.device import resolve_device
from deliverykit.testing import assert_equal_up_to_reordering, require_accelerator, require_npu, torch_threads
from trellis2_npu import sparse_conv
from trellis2_npu.sparse_conv import (
    KernelNeighbors,
    build_neighbor_map,
    cached_neighbor_map,
    neighbor_cache_key,
    sparse_submanifold_conv3d,
    submanifold_conv3d,
)

GRID = (7, 6, 5)  # X, Y, Z: unequal, so a swapped axis cannot go unnoticed


def random_voxels(seed: int, items: int = 3, grid: tuple[int, int, int] = GRID, occupancy: float = 0.35):
    """``[N, 4]`` int32 ``(b, x, y, z)`` coordinates, a different random set per batch item, shuffled."""
    gen = torch.Generator().manual_seed(seed)
    coords = (torch.rand(items, *grid, generator=gen) < occupancy).nonzero().int()
    return coords[torch.randperm(coords.shape[0], generator=gen)]


def random_conv(seed: int, num_voxels: int, kernel_size=(3, 3, 3), ci: int = 5, co: int = 3, dtype=torch.float64):
    """Features ``[N, Ci]``, checkpoint-layout weight ``[Co, K0, K1, K2, Ci]`` and bias ``[Co]``."""
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(num_voxels, ci, generator=gen, dtype=dtype)
    weight = torch.randn(co, *kernel_size, ci, generator=gen, dtype=dtype)
    bias = torch.randn(co, generator=gen, dtype=dtype)
    return feats, weight, bias


def dense_conv(feats, coords, weight_ncdhw, bias=None, dilation=(1, 1, 1), grid=GRID):
    """The submanifold convolution computed densely, with a weight already in ``F.conv3d`` layout."""
    items = int(coords[:, 0].max()) + 1
    b, x, y, z = coords.long().unbind(dim=1)
    volume = feats.new_zeros(items, feats.shape[1], *grid)
    volume[b, :, x, y, z] = feats
    padding = tuple(d * (k // 2) for d, k in zip(dilation, weight_ncdhw.shape[2:], strict=True))
    out = F.conv3d(volume, weight_ncdhw, bias, padding=padding, dilation=dilation)
    return out[b, :, x, y, z]


CASES = [
    pytest.param((3, 3, 3), (1, 1, 1), id="k3"),
    pytest.param((3, 3, 3), (2, 2, 2), id="k3-dilation2"),
    pytest.param((3, 1, 5), (1, 2, 1), id="k3x1x5-dilation121"),
]


@pytest.mark.parametrize(("kernel_size", "dilation"), CASES)
@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["fp64", "fp32"])
def test_matches_dense_conv3d(kernel_size, dilation, use_bias, dtype, tol):
    coords = random_voxels(seed=0)
    feats, weight, bias = random_conv(1, coords.shape[0], kernel_size, dtype=dtype)
    bias = bias if use_bias else None
    reference_bias = bias.double() if use_bias else None
    reference = dense_conv(feats.double(), coords, weight.double().permute(0, 4, 1, 2, 3), reference_bias, dilation)
    for rows_per_block in (None, 16):  # one block, and many blocks with rows that have no neighbour in them
        neighbor_map = build_neighbor_map(coords, GRID, kernel_size, dilation, rows_per_block=rows_per_block)
        out = submanifold_conv3d(feats, neighbor_map, weight, bias)
        assert out.dtype == dtype and out.shape == (coords.shape[0], weight.shape[0])
        assert (out.double() - reference).abs().max().item() <= tol


def test_flex_gemm_api_returns_output_and_reusable_cache():
    """Same call and return convention as upstream's conv_flex_gemm.py uses; a passed cache comes back as is."""
    coords = random_voxels(seed=2)
    feats, weight, bias = random_conv(3, coords.shape[0])
    shape = torch.Size([3, feats.shape[1], *GRID])
    out, cache = sparse_submanifold_conv3d(feats, coords, shape, weight, bias, None, (1, 1, 1))
    again, cache_again = sparse_submanifold_conv3d(feats, coords, shape, weight, bias, cache, (1, 1, 1))
    assert cache_again is cache
    assert torch.equal(out, again)
    reference = dense_conv(feats, coords, weight.permute(0, 4, 1, 2, 3), bias)
    assert (out - reference).abs().max().item() <= 1e-10
    with pytest.raises(ValueError, match="dilation"):
        sparse_submanifold_conv3d(feats, coords, shape, weight, bias, cache, (2, 2, 2))


def test_checkpoint_layout_is_not_co_ci_k_k_k():
    """Trap 5: the [Co, K0, K1, K2, Ci] weight read as [Co, Ci, K, K, K], or with x and z swapped, runs but is wrong."""
    coords = random_voxels(seed=4)
    feats, weight, bias = random_conv(5, coords.shape[0], ci=3, co=4)
    out = submanifold_conv3d(feats, build_neighbor_map(coords, GRID), weight, bias)
    scale = out.abs().max().item()
    wrong_weights = {
        "as [Co, Ci, K, K, K]": weight.reshape(4, 3, 3, 3, 3),
        "x and z swapped": weight.permute(0, 4, 3, 2, 1),
    }
    for name, wrong in wrong_weights.items():
        assert (out - dense_conv(feats, coords, wrong, bias)).abs().max().item() > 0.1 * scale, name
    assert (out - dense_conv(feats, coords, weight.permute(0, 4, 1, 2, 3), bias)).abs().max().item() <= 1e-10


def test_batch_items_never_see_each_other():
    """Two items with the same xyz sites: item 0's output ignores item 1's features entirely."""
    single = random_voxels(seed=6, items=1)
    coords = torch.cat([single, single + torch.tensor([1, 0, 0, 0], dtype=single.dtype)])
    feats, weight, bias = random_conv(7, coords.shape[0])
    neighbor_map = build_neighbor_map(coords, GRID)
    alone = submanifold_conv3d(feats[: single.shape[0]], build_neighbor_map(single, GRID), weight, bias)
    noisy = feats.clone()
    noisy[single.shape[0] :] = 1e6
    for features in (feats, noisy):
        out = submanifold_conv3d(features, neighbor_map, weight, bias)
        assert torch.allclose(out[: single.shape[0]], alone, rtol=0, atol=1e-12)


def test_output_rows_follow_input_order():
    coords = random_voxels(seed=8)
    feats, weight, bias = random_conv(9, coords.shape[0])
    out = submanifold_conv3d(feats, build_neighbor_map(coords, GRID), weight, bias)
    order = torch.randperm(coords.shape[0], generator=torch.Generator().manual_seed(10))
    shuffled = submanifold_conv3d(feats[order], build_neighbor_map(coords[order], GRID), weight, bias)
    assert torch.allclose(shuffled, out[order], rtol=0, atol=1e-12)


def test_neighbor_map_is_built_once_per_voxel_set_and_kernel(monkeypatch):
    """Upstream keeps one map per level under this key; every conv of that level must hit it."""
    builds = []

    def counting_build(*args, **kwargs):
        builds.append(args)
        return build_neighbor_map(*args, **kwargs)

    monkeypatch.setattr(sparse_conv, "build_neighbor_map", counting_build)
    coords = random_voxels(seed=11)
    cache = {}
    first = cached_neighbor_map(cache, coords, GRID, 3, 1)
    assert cached_neighbor_map(cache, coords, GRID, 3, 1) is first
    assert list(cache) == ["SubMConv3d_neighbor_cache_3x3x3_dilation(1, 1, 1)"]
    assert cached_neighbor_map(cache, coords, GRID, 3, 2) is not first
    assert len(builds) == 2
    # upstream prints the weight's (Kd, Kh, Kw) = (K0, K1, K2) as KwxKhxKd
    assert neighbor_cache_key((3, 1, 5), (1, 2, 1)) == "SubMConv3d_neighbor_cache_5x1x3_dilation(1, 2, 1)"


def test_gradients_match_dense_conv3d():
    coords = random_voxels(seed=12, items=2)
    feats, weight, bias = random_conv(13, coords.shape[0])
    ours = [t.clone().requires_grad_() for t in (feats, weight, bias)]
    dense = [t.clone().requires_grad_() for t in (feats, weight, bias)]
    upstream_grad = torch.randn(coords.shape[0], weight.shape[0], dtype=torch.float64)
    submanifold_conv3d(ours[0], build_neighbor_map(coords, GRID), ours[1], ours[2]).backward(upstream_grad)
    dense_conv(dense[0], coords, dense[1].permute(0, 4, 1, 2, 3), dense[2]).backward(upstream_grad)
    for mine, reference in zip(ours, dense, strict=True):
        assert (mine.grad - reference.grad).abs().max().item() <= 1e-10


def test_rejects_inputs_that_would_silently_misbehave():
    coords = random_voxels(seed=14)
    feats, weight, bias = random_conv(15, coords.shape[0])
    with pytest.raises(ValueError, match="odd kernel"):
        build_neighbor_map(coords, GRID, kernel_size=2)
    with pytest.raises(ValueError, match="spatial_shape"):
        build_neighbor_map(coords, (4, 4, 4))
    with pytest.raises(ValueError, match="spatial_shape"):  # a negative coordinate
        build_neighbor_map(coords - torch.tensor([0, 1, 0, 0], dtype=coords.dtype), GRID)
    neighbor_map = build_neighbor_map(coords, GRID)
    with pytest.raises(ValueError, match=r"\[Co, K0, K1, K2, Ci\]"):
        submanifold_conv3d(feats, neighbor_map, weight.permute(0, 4, 1, 2, 3), bias)  # a [Co, Ci, K, K, K] tensor


def test_empty_voxel_set_and_isolated_voxels():
    coords = torch.tensor([[0, 0, 0, 0], [0, 4, 4, 4]], dtype=torch.int32)  # no neighbour within 3x3x3
    feats, weight, bias = random_conv(16, 2)
    out = submanifold_conv3d(feats, build_neighbor_map(coords, GRID), weight, bias)
    assert torch.allclose(out, feats @ weight[:, 1, 1, 1, :].T + bias, rtol=0, atol=1e-12)
    empty = build_neighbor_map(coords[:0], GRID)
    assert submanifold_conv3d(feats[:0], empty, weight, bias).shape == (0, weight.shape[0])


@require_accelerator
def test_runs_on_accelerator_like_on_cpu():
    """Every tensor the map and the convolution create must live on the input's device."""
    device = resolve_device("auto")
    coords = random_voxels(seed=17)
    feats, weight, bias = random_conv(18, coords.shape[0], dtype=torch.float32)
    expected = submanifold_conv3d(feats, build_neighbor_map(coords, GRID), weight, bias)
    out, _ = sparse_submanifold_conv3d(
        feats.to(device), coords.to(device), torch.Size([3, 5, *GRID]), weight.to(device), bias.to(device)
    )
    assert out.device == device
    assert (out.cpu() - expected).abs().max().item() <= 1e-4


def test_the_kernels_cpu_reference_is_this_convolution():
    """deliverykit's dense reference of ``subm_conv3d`` and this sparse convolution: two implementations, one sum."""
    coords = random_voxels(seed=23)
    feats, weight, bias = random_conv(24, coords.shape[0])
    expected = submanifold_conv3d(feats, build_neighbor_map(coords, GRID), weight, bias)
    reference = ops.kernels()["subm_conv3d"].reference(feats, coords, GRID, weight, bias)
    assert_equal_up_to_reordering(reference, expected, "subm_conv3d reference")


@pytest.mark.parametrize(
    ("kernel_size", "dilation", "dtype", "routed"),
    [
        ((3, 3, 3), 1, torch.float32, True),
        ((3, 3, 3), 1, torch.float16, True),
        ((3, 3, 3), 1, torch.bfloat16, False),  # the 910B kernel takes float32 / float16 only
        ((3, 3, 3), 2, torch.float32, False),
        ((5, 5, 5), 1, torch.float32, False),
    ],
)
def test_the_device_kernel_takes_only_what_it_supports_and_keeps_its_state(
    monkeypatch, kernel_size, dilation, dtype, routed
):
    """With the kernel selectable (as on an NPU with mx_driving), the drop-in hands it the convolutions within its
    documented constraints, with one state dict per voxel set that the next call gets back; the rest stay here."""
    calls = []

    def stand_in(feats, coords, spatial_shape, weight, bias=None, cache=None):
        calls.append(cache)
        cache["indices_offset"] = "filled by the first call"
        return ops.kernels()["subm_conv3d"].reference(feats, coords, spatial_shape, weight, bias)

    monkeypatch.setattr(ops, "uses_npu_kernel", lambda name, device: name == "subm_conv3d")
    monkeypatch.setattr(ops, "select", lambda name, device: stand_in)
    coords = random_voxels(seed=25)
    feats, weight, bias = random_conv(26, coords.shape[0], kernel_size=kernel_size, dtype=dtype)
    shape = torch.Size([3, 5, *GRID])
    out, cache = sparse_submanifold_conv3d(feats, coords, shape, weight, bias, dilation=dilation)
    again, same = sparse_submanifold_conv3d(feats, coords, shape, weight, bias, cache, dilation)
    assert same is cache and isinstance(cache, KernelNeighbors) is routed
    assert len(calls) == (2 if routed else 0)
    if routed:
        assert calls[0] is calls[1] is cache.state and cache.state["indices_offset"] == "filled by the first call"
    torch.testing.assert_close(again, out, rtol=0, atol=0)


@require_npu
def test_drivingsdk_kernel_matches_this_convolution_on_npu():
    """mx_driving's SubMConv3d (its weight layout, offset order and output order) against this convolution."""
    if not ops.kernels()["subm_conv3d"].installed():
        pytest.skip("DrivingSDK is not installed: pip install --no-deps mx-driving (trellis2-npu/README.md)")
    coords = random_voxels(seed=27)
    feats, weight, bias = random_conv(28, coords.shape[0], ci=16, co=8, dtype=torch.float32)
    expected = submanifold_conv3d(feats, build_neighbor_map(coords, GRID), weight, bias)
    npu = [t.to("npu:0") for t in (feats, coords, weight, bias)]
    out, cache = sparse_submanifold_conv3d(npu[0], npu[1], torch.Size([3, 16, *GRID]), npu[2], npu[3])
    assert isinstance(cache, KernelNeighbors)  # the kernel ran, not this convolution on the NPU
    again, _ = sparse_submanifold_conv3d(npu[0], npu[1], torch.Size([3, 16, *GRID]), npu[2], npu[3], cache)
    # float32 sums of <= 27·16 products of N(0, 1) values (~20): the NPU's own GEMM order, a few 1e-5 apart
    torch.testing.assert_close(out.cpu(), expected, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(again.cpu(), expected, atol=1e-3, rtol=1e-4)  # with its offsets reused


@pytest.mark.parametrize("dilation", [1, 2])
def test_matches_spconv(dilation):
    """spconv's SubMConv3d keeps the same [Co, K0, K1, K2, Ci] layout (with indices (b, x, y, z)): copied 1:1."""
    spconv = pytest.importorskip("spconv.pytorch")
    coords = random_voxels(seed=19, grid=(12, 10, 9), occupancy=0.3)
    feats, weight, bias = random_conv(20, coords.shape[0], ci=16, co=8, dtype=torch.float32)
    weight = weight / 8
    conv = spconv.SubMConv3d(16, 8, 3, dilation=dilation, bias=True).train()  # eval() asserts on CPU with bias
    with torch.no_grad():
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # spconv's CPU path returns wrong rows with more than one thread
    try:
        with torch.no_grad():
            expected = conv(spconv.SparseConvTensor(feats, coords, [12, 10, 9], batch_size=3)).features
    finally:
        torch.set_num_threads(threads)
    neighbor_map = build_neighbor_map(coords, (12, 10, 9), dilation=dilation)
    out = submanifold_conv3d(feats, neighbor_map, weight, bias)
    assert (out - expected).abs().max().item() <= 1e-5


@pytest.fixture
def two_threads():
    """Two intra-op threads (even on one core), so that both CPU thread policies really run."""
    with torch_threads(2):
        yield


def maps_equal(a, b) -> bool:
    fields = ("start", "end", "offset_ranges")
    tensors = ("src", "bag_indices", "bag_offsets")
    return (a.kernel_size, a.dilation, a.num_voxels, len(a.blocks)) == (
        b.kernel_size,
        b.dilation,
        b.num_voxels,
        len(b.blocks),
    ) and all(
        all(getattr(x, f) == getattr(y, f) for f in fields)
        and all(getattr(x, t).dtype == torch.int32 and torch.equal(getattr(x, t), getattr(y, t)) for t in tensors)
        for x, y in zip(a.blocks, b.blocks, strict=True)
    )


@pytest.mark.parametrize(("kernel_size", "dilation"), CASES)
def test_thread_policies_agree(two_threads, kernel_size, dilation):
    """Workers and intra-op threads: the same map, and outputs equal up to float reordering (both = dense conv)."""
    grid = (24, 20, 18)
    coords = random_voxels(seed=21, items=2, grid=grid, occupancy=0.3)
    feats, weight, bias = random_conv(22, coords.shape[0], kernel_size, ci=16, co=8, dtype=torch.float32)
    maps = {
        policy: build_neighbor_map(coords, grid, kernel_size, dilation, rows_per_block=64, cpu_threads=policy)
        for policy in sparse_conv.CPU_THREAD_POLICIES
    }
    assert len(maps["workers"].blocks) > 10
    assert maps_equal(maps["workers"], maps["intra-op"])
    reference = dense_conv(feats, coords, weight.permute(0, 4, 1, 2, 3), bias, dilation, grid)
    outputs = {policy: submanifold_conv3d(feats, maps[policy], weight, bias, cpu_threads=policy) for policy in maps}
    with torch.inference_mode():
        outputs["workers, inference mode"] = submanifold_conv3d(feats, maps["workers"], weight, bias)
    torch.set_num_threads(1)
    outputs["1 thread"] = submanifold_conv3d(feats, maps["workers"], weight, bias)
    for name, out in outputs.items():
        assert_equal_up_to_reordering(out, outputs["1 thread"], name)
        assert (out - reference).abs().max().item() <= 1e-4, name


def test_workers_keep_the_callers_thread_count(two_threads):
    coords = random_voxels(seed=23)
    feats, weight, bias = random_conv(24, coords.shape[0], dtype=torch.float32)
    submanifold_conv3d(feats, build_neighbor_map(coords, GRID), weight, bias, cpu_threads="workers")
    assert torch.get_num_threads() == 2
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert seen == [2]  # a thread started afterwards begins with the caller's count, not the workers' 1


def test_workers_run_under_no_grad_with_trainable_inputs(two_threads):
    """Not recording (no_grad) although the inputs require grad: the workers must not record either."""
    coords = random_voxels(seed=25)
    feats, weight, bias = (t.requires_grad_() for t in random_conv(26, coords.shape[0], dtype=torch.float32))
    neighbor_map = build_neighbor_map(coords, GRID)
    with torch.no_grad():
        out = submanifold_conv3d(feats, neighbor_map, weight, bias)
    assert not out.requires_grad
    recorded = submanifold_conv3d(feats, neighbor_map, weight, bias)
    assert recorded.requires_grad
    assert_equal_up_to_reordering(recorded, out, "recorded vs no_grad")


@pytest.mark.parametrize(("kernel_size", "dilation"), CASES)
def test_binary_search_lookup_gives_the_same_map(monkeypatch, kernel_size, dilation):
    """A bounding box too large for the dense lookup falls back to sorted keys + searchsorted: same pairs."""
    coords = random_voxels(seed=27, items=2, grid=(12, 10, 9), occupancy=0.3)
    dense = build_neighbor_map(coords, (12, 10, 9), kernel_size, dilation, rows_per_block=32)
    monkeypatch.setattr(sparse_conv, "DENSE_LOOKUP_MIN_CELLS", 0)
    monkeypatch.setattr(sparse_conv, "DENSE_LOOKUP_CELLS_PER_SITE", 0)
    searched = build_neighbor_map(coords, (12, 10, 9), kernel_size, dilation, rows_per_block=32)
    assert maps_equal(dense, searched)


def brute_force_blocks(coords, kernel_size, dilation, rows_per_block):
    """The map's blocks from their definition, one site and offset at a time in Python: ``(start, end,
    offset_ranges, src, bag_indices, bag_offsets)`` for every block of output rows that has a non-centre pair."""
    sites = [tuple(site) for site in coords.tolist()]
    row_of = {site: row for row, site in enumerate(sites)}
    shifts = [
        tuple((step - k // 2) * d for step, k, d in zip(steps, kernel_size, dilation, strict=True))
        for steps in itertools.product(*(range(k) for k in kernel_size))
    ]
    blocks = []
    for start in range(0, len(sites), rows_per_block):
        end = min(start + rows_per_block, len(sites))
        pairs = []  # (offset, output row, input row)
        for row in range(start, end):
            b, *xyz = sites[row]
            for offset, shift in enumerate(shifts):
                neighbor = (b, *(c + s for c, s in zip(xyz, shift, strict=True)))
                if offset != len(shifts) // 2 and neighbor in row_of:
                    pairs.append((offset, row, row_of[neighbor]))
        if not pairs:
            continue
        pairs.sort()  # by offset, then output row: the GEMM order
        ranges = []
        for offset, group in itertools.groupby(range(len(pairs)), key=lambda i: pairs[i][0]):
            group = list(group)
            ranges.append((offset, group[0], group[-1] + 1))
        bag = sorted(range(len(pairs)), key=lambda i: (pairs[i][1], pairs[i][0]))  # by output row, then offset
        per_row = [sum(pair[1] == row for pair in pairs) for row in range(start, end)]
        bag_offsets = list(itertools.accumulate(per_row, initial=0))
        blocks.append((start, end, tuple(ranges), [pair[2] for pair in pairs], bag, bag_offsets))
    return blocks


def assert_matches_brute_force(neighbor_map, coords, kernel_size, dilation, rows_per_block):
    expected = brute_force_blocks(coords, kernel_size, dilation, rows_per_block)
    found = [
        (b.start, b.end, b.offset_ranges, b.src.tolist(), b.bag_indices.tolist(), b.bag_offsets.tolist())
        for b in neighbor_map.blocks
    ]
    assert found == expected
    assert all(t.dtype == torch.int32 for b in neighbor_map.blocks for t in (b.src, b.bag_indices, b.bag_offsets))


@pytest.mark.parametrize(("kernel_size", "dilation"), CASES)
@pytest.mark.parametrize("lookup", ["dense", "search"])
def test_neighbor_map_matches_brute_force(monkeypatch, kernel_size, dilation, lookup):
    """Both lookups give the pairs of the definition, with sites on every face of the grid and 3 batch items.

    7 rows per block leave the last block short; 3 blocks per task make several tasks, the last one short too.
    """
    grid = (9, 7, 6)
    coords = random_voxels(seed=31, items=3, grid=grid, occupancy=0.4)
    assert all(int(coords[:, 1 + a].min()) == 0 and int(coords[:, 1 + a].max()) == grid[a] - 1 for a in range(3))
    monkeypatch.setattr(sparse_conv, "MAP_ROWS_PER_TASK", 21)
    if lookup == "search":
        monkeypatch.setattr(sparse_conv, "DENSE_LOOKUP_MIN_CELLS", 0)
        monkeypatch.setattr(sparse_conv, "DENSE_LOOKUP_CELLS_PER_SITE", 0)
    box = coords.amin(dim=0).tolist(), coords.amax(dim=0).tolist()
    sides = sparse_conv._widened_box(*box, kernel_size, dilation)[1]
    assert sparse_conv._fits_dense_array(sides, coords.shape[0]) == (lookup == "dense")
    neighbor_map = build_neighbor_map(coords, grid, kernel_size, dilation, rows_per_block=7)
    assert_matches_brute_force(neighbor_map, coords, kernel_size, dilation, 7)


def test_far_apart_sites_are_searched_and_match_brute_force(monkeypatch):
    """Sites at opposite corners of a 4096³ grid span 2·2^36 cells: past the dense array's int32 keys even when
    the per-site allowance would take it, so the binary search runs, and finds the same pairs as the definition."""
    grid = (4096, 4096, 4096)
    gen = torch.Generator().manual_seed(33)
    cube = (torch.rand(2, 4, 4, 4, generator=gen) < 0.6).nonzero().int()
    coords = torch.cat([cube, cube + torch.tensor([0, 4092, 4092, 4092], dtype=torch.int32)])
    coords = coords[torch.randperm(coords.shape[0], generator=gen)]
    monkeypatch.setattr(sparse_conv, "DENSE_LOOKUP_CELLS_PER_SITE", 2**40)
    box = coords.amin(dim=0).tolist(), coords.amax(dim=0).tolist()
    sides = sparse_conv._widened_box(*box, (3, 3, 3), (1, 1, 1))[1]
    assert not sparse_conv._fits_dense_array(sides, coords.shape[0])
    for kernel_size, dilation in [((3, 3, 3), (1, 1, 1)), ((3, 1, 5), (1, 2, 1))]:
        neighbor_map = build_neighbor_map(coords, grid, kernel_size, dilation, rows_per_block=16)
        assert_matches_brute_force(neighbor_map, coords, kernel_size, dilation, 16)


def test_rejects_unknown_thread_policy(monkeypatch):
    coords = random_voxels(seed=28)
    with pytest.raises(ValueError, match="cpu_threads must be one of workers, intra-op, got 'openmp'"):
        build_neighbor_map(coords, GRID, cpu_threads="openmp")
    monkeypatch.setenv(sparse_conv.CPU_THREADS_ENV, "auto")
    with pytest.raises(ValueError, match=r"\$TRELLIS2_SPARSE_CONV_CPU_THREADS must be one of"):
        build_neighbor_map(coords, GRID)
    monkeypatch.setenv(sparse_conv.CPU_THREADS_ENV, "intra-op")
    assert build_neighbor_map(coords, GRID).num_voxels == coords.shape[0]


def _convolve_in_child(queue, feats, coords, weight, bias):
    queue.put(submanifold_conv3d(feats, build_neighbor_map(coords, GRID), weight, bias).numpy())  # no shared memory


def test_workers_start_anew_in_a_forked_child(two_threads):
    """A child forked after the workers started has none of their threads: it must start its own, not hang."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("fork is not available on this platform")
    coords = random_voxels(seed=29)
    feats, weight, bias = random_conv(30, coords.shape[0], dtype=torch.float32)
    expected = submanifold_conv3d(feats, build_neighbor_map(coords, GRID), weight, bias)  # workers started here
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_convolve_in_child, args=(queue, feats, coords, weight, bias))
    child.start()
    try:
        got = queue.get(timeout=60)
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert_equal_up_to_reordering(got, expected, "forked child")
