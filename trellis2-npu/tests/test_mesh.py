"""Flexible dual grid → mesh against a brute-force enumeration written independently of the module.

The brute force walks voxels and axes in Python with a dict of coordinates, transcribing upstream's
``o-voxel/o_voxel/convert/flexible_dual_grid.py`` (inference path) rule by rule, including its normal-based split
as literally written (see ``trellis2_npu.geometry.dual_grid._split_by_normals``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from trellis2_npu.geometry.dual_grid import flexible_dual_grid_to_mesh

AABB = [[-0.5, -0.5, -0.5], [0.5, 0.5, 0.5]]  # the decoder's box
# Dual-edge stencils copied from upstream flexible_dual_grid.py:173-177 (x, y, z axes).
STENCILS = [
    [(0, 0, 0), (0, 0, 1), (0, 1, 1), (0, 1, 0)],
    [(0, 0, 0), (1, 0, 0), (1, 0, 1), (0, 0, 1)],
    [(0, 0, 0), (0, 1, 0), (1, 1, 0), (1, 0, 0)],
]


def _cross(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def _sub(a, b):
    return tuple(x - y for x, y in zip(a, b, strict=True))


def _upstream_normal_score(verts, tri6):
    """|n(slots 0,1,2) · n(slots 1,2,3)| exactly as upstream indexes its 6-entry candidate."""
    a, b, c, d = (verts[k] for k in tri6[:4])
    n0 = _cross(_sub(b, a), _sub(c, a))
    n1 = _cross(_sub(c, b), _sub(d, b))
    return abs(sum(x * y for x, y in zip(n0, n1, strict=True)))


def brute_force_mesh(coords, dual, flags, weights, grid_size):
    """Vertices (float32, per element) and faces (list of triangles) by explicit loops."""
    lo = np.float32(-0.5)
    voxel = np.float32(1.0) / np.float32(grid_size)
    verts = [
        tuple(float((np.float32(c) + np.float32(d)) * voxel + lo) for c, d in zip(row, drow, strict=True))
        for row, drow in zip(coords, dual, strict=True)
    ]
    table = {}
    for i, row in enumerate(coords):
        table.setdefault(tuple(row), i)
    faces = []
    for i, row in enumerate(coords):
        for axis in range(3):
            if not flags[i][axis]:
                continue
            corners = [tuple(r + o for r, o in zip(row, off, strict=True)) for off in STENCILS[axis]]
            if not all(c in table and all(0 <= v < grid_size for v in c) for c in corners):
                continue
            q = [table[c] for c in corners]
            split_a = [q[0], q[1], q[2], q[0], q[2], q[3]]
            split_b = [q[0], q[1], q[3], q[3], q[1], q[2]]
            if weights is None:
                use_a = _upstream_normal_score(verts, split_a) > _upstream_normal_score(verts, split_b)
            else:
                use_a = float(weights[q[0]] * weights[q[2]]) > float(weights[q[1]] * weights[q[3]])
            tri = split_a if use_a else split_b
            faces += [tuple(tri[:3]), tuple(tri[3:])]
    return verts, faces


def _random_voxels(seed: int, grid_size: int, occupancy: float = 0.7):
    gen = torch.Generator().manual_seed(seed)
    dense = torch.rand(grid_size, grid_size, grid_size, generator=gen) < occupancy
    dense[0, 0, 0] = dense[-1, -1, -1] = dense[0, -1, 0] = True  # always some voxels on the grid border
    coords = dense.nonzero().int()
    coords = coords[torch.randperm(coords.shape[0], generator=gen)]  # upstream's order must not depend on sorting
    n = coords.shape[0]
    dual = torch.rand(n, 3, generator=gen) * 2 - 0.5  # the decoder's range [-0.5, 1.5]
    flags = torch.rand(n, 3, generator=gen) < 0.5
    weights = torch.nn.functional.softplus(torch.randn(n, 1, generator=gen))
    return coords, dual, flags, weights


def _check_against_brute_force(coords, dual, flags, weights, grid_size):
    vertices, faces = flexible_dual_grid_to_mesh(coords, dual, flags, weights, aabb=AABB, grid_size=grid_size)
    exp_verts, exp_faces = brute_force_mesh(coords.tolist(), dual.tolist(), flags.tolist(), weights, grid_size)
    assert vertices.dtype == torch.float32 and vertices.shape == (coords.shape[0], 3)
    assert vertices.tolist() == [list(v) for v in exp_verts]  # bit-exact, every voxel (used or not)
    assert faces.dtype == torch.int32 and faces.shape == (len(exp_faces), 3)
    got = [tuple(f) for f in faces.tolist()]
    assert sorted(tuple(sorted(f)) for f in got) == sorted(tuple(sorted(f)) for f in exp_faces)
    assert got == exp_faces  # same order and winding as upstream's voxel-major, x/y/z loop
    return faces


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("with_weights", [True, False])
def test_random_voxels_match_brute_force(seed, with_weights):
    coords, dual, flags, weights = _random_voxels(seed, grid_size=7)
    faces = _check_against_brute_force(coords, dual, flags, weights if with_weights else None, grid_size=7)
    assert faces.shape[0] > 50  # the case is not trivially empty


def _block_2x2x2():
    """All 8 voxels of a 2×2×2 block, row i = (x, y, z) with i = 4x + 2y + z; vertices at voxel centres."""
    coords = torch.tensor(list(itertools.product(range(2), repeat=3)), dtype=torch.int32)
    return coords, torch.full((8, 3), 0.5)


def test_hand_made_block_with_one_flag():
    coords, dual = _block_2x2x2()
    flags = torch.zeros(8, 3, dtype=torch.bool)
    flags[0, 0] = True  # x-edge of voxel (0,0,0): quad (0,0,0) (0,0,1) (0,1,1) (0,1,0) = rows 0, 1, 3, 2
    weights = torch.ones(8, 1)
    weights[[0, 3]] = 2.0  # w0·w2 = 4 > w1·w3 = 1: split on the diagonal rows 0-3
    vertices, faces = flexible_dual_grid_to_mesh(coords, dual, flags, weights, aabb=AABB, grid_size=4)
    assert faces.tolist() == [[0, 1, 3], [0, 3, 2]]
    assert vertices[7].tolist() == [-0.125] * 3  # (1 + 0.5) · 1/4 - 0.5
    weights[[0, 3]] = 1.0  # tie: w0·w2 = w1·w3, so upstream's strict ">" takes the other diagonal, rows 1-2
    _, faces = flexible_dual_grid_to_mesh(coords, dual, flags, weights, aabb=AABB, grid_size=4)
    assert faces.tolist() == [[0, 1, 2], [2, 1, 3]]


def test_normal_rule_takes_the_other_diagonal_only_for_a_degenerate_first_triangle():
    coords, dual = _block_2x2x2()
    flags = torch.zeros(8, 3, dtype=torch.bool)
    flags[0, 0] = True
    _, faces = flexible_dual_grid_to_mesh(coords, dual, flags, None, aabb=AABB, grid_size=2)
    assert faces.tolist() == [[0, 1, 3], [0, 3, 2]]
    dual[1] = torch.tensor([0.5, 1.0, 0.0])  # vertex of row 1 at the midpoint of rows 0 and 3: (0,1,3) collinear
    _, faces = flexible_dual_grid_to_mesh(coords, dual, flags, None, aabb=AABB, grid_size=2)
    assert faces.tolist() == [[0, 1, 2], [2, 1, 3]]


def test_exactly_three_quads_without_weights():
    """Upstream's dim-less ``torch.cross`` would take dimension 0 here; the brute force uses x, y, z components."""
    coords, dual = _block_2x2x2()
    dual[1] = torch.tensor([0.5, 1.0, 0.0])
    flags = torch.zeros(8, 3, dtype=torch.bool)
    flags[0] = True
    faces = _check_against_brute_force(coords, dual, flags, None, grid_size=2)
    assert faces.shape == (6, 3)


def test_incomplete_quads_and_voxels_outside_the_grid_are_dropped():
    coords, dual = _block_2x2x2()
    keep = torch.arange(8) != 3  # remove (0,1,1): the x-edge quad of voxel 0 loses a corner
    coords, dual = coords[keep], dual[keep]
    flags = torch.zeros(7, 3, dtype=torch.bool)
    flags[0] = True  # x quad incomplete; y quad (0,0,0) (1,0,0) (1,0,1) (0,0,1) and z quad complete
    _, faces = flexible_dual_grid_to_mesh(coords, dual, flags, torch.ones(7), aabb=AABB, grid_size=2)
    assert faces.shape == (4, 3)
    _, faces = flexible_dual_grid_to_mesh(coords, dual, flags, torch.ones(7), aabb=AABB, grid_size=[2, 2, 1])
    assert faces.shape == (2, 3)  # z = 1 lies outside a depth-1 grid: only the z quad (all at z = 0) remains


def test_voxel_size_and_aabb_forms_agree_with_grid_size():
    coords, dual, flags, weights = _random_voxels(5, grid_size=6)
    expected = flexible_dual_grid_to_mesh(coords, dual, flags, weights, aabb=AABB, grid_size=6)
    for kwargs in (
        {"aabb": np.array(AABB), "voxel_size": 1 / 6},
        {"aabb": torch.tensor(AABB), "grid_size": (6, 6, 6)},
        {"aabb": tuple(map(tuple, AABB)), "grid_size": torch.tensor([6, 6, 6], dtype=torch.int32)},
    ):
        vertices, faces = flexible_dual_grid_to_mesh(coords, dual, flags, weights, **kwargs)
        torch.testing.assert_close(vertices, expected[0], rtol=0, atol=1e-7)
        assert torch.equal(faces, expected[1])


def test_empty_inputs_and_rejected_arguments():
    coords = torch.zeros(0, 3, dtype=torch.int32)
    vertices, faces = flexible_dual_grid_to_mesh(
        coords, torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.bool), torch.zeros(0, 1), aabb=AABB, grid_size=4
    )
    assert vertices.shape == (0, 3) and faces.shape == (0, 3)
    coords, dual, flags, weights = _random_voxels(0, grid_size=4)
    with pytest.raises(ValueError, match="train=False"):
        flexible_dual_grid_to_mesh(coords, dual, flags, weights, aabb=AABB, grid_size=4, train=True)
    with pytest.raises(ValueError, match="voxel_size or grid_size"):
        flexible_dual_grid_to_mesh(coords, dual, flags, weights, aabb=AABB)
    with pytest.raises(ValueError, match="one value per voxel"):
        flexible_dual_grid_to_mesh(coords, dual, flags, weights[:-1], aabb=AABB, grid_size=4)
