"""Flexible dual grid → triangle mesh, the last step of TRELLIS.2's shape decoder, without o-voxel's CUDA hash.

Adapted from: microsoft/TRELLIS.2 @ 5565d240, ``o-voxel/o_voxel/convert/flexible_dual_grid.py::
flexible_dual_grid_to_mesh`` (inference path, ``train=False``), called by
``trellis2/models/sc_vaes/fdg_vae.py::FlexiDualGridVaeDecoder.forward``.
Changes:
- voxel lookup uses sorted int64 keys and ``torch.searchsorted`` (:mod:`trellis2_npu.voxel_lookup`) instead of
  ``_C.hashmap_insert_3d_idx_as_val_cuda`` / ``_C.hashmap_lookup_3d_cuda``, so it runs on NPU, CUDA and CPU;
- constants are cached per device, not stored on the function for the first call's device;
- ``split_weight`` may be ``[N]`` as well as ``[N, 1]``;
- the normal-based split (``split_weight=None``) calls ``torch.linalg.cross`` on the last dimension, where
  upstream's ``torch.cross`` without ``dim`` picks dimension 0 when exactly three quads are found;
- ``train=True`` (a mid-vertex per quad, used only to train the VAE) is not ported.
Outputs are otherwise identical, faces in the same order and dtype (int32).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..voxel_lookup import build_voxel_index, lookup_voxels

# The 4 voxels around the dual edge of each axis, in upstream's winding order (flexible_dual_grid.py:173-177).
QUAD_OFFSETS = (
    ((0, 0, 0), (0, 0, 1), (0, 1, 1), (0, 1, 0)),  # x
    ((0, 0, 0), (1, 0, 0), (1, 0, 1), (0, 0, 1)),  # y
    ((0, 0, 0), (0, 1, 0), (1, 1, 0), (1, 0, 0)),  # z
)
SPLIT_02 = (0, 1, 2, 0, 2, 3)  # two triangles sharing the diagonal 0-2 (upstream's quad_split_1)
SPLIT_13 = (0, 1, 3, 3, 1, 2)  # two triangles sharing the diagonal 1-3 (upstream's quad_split_2)


def flexible_dual_grid_to_mesh(
    coords: torch.Tensor,
    dual_vertices: torch.Tensor,
    intersected_flag: torch.Tensor,
    split_weight: torch.Tensor | None,
    aabb: list | tuple | np.ndarray | torch.Tensor,
    voxel_size: float | list | tuple | np.ndarray | torch.Tensor | None = None,
    grid_size: int | list | tuple | np.ndarray | torch.Tensor | None = None,
    train: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Build one mesh vertex per voxel and two triangles per flagged dual edge whose 4 voxels all exist.

    Drop-in for ``o_voxel.convert.flexible_dual_grid_to_mesh`` at inference (``train=False``).

    Args:
        coords (`torch.Tensor`): ``[N, 3]`` integer voxel coordinates of one item (no batch column).
        dual_vertices (`torch.Tensor`): ``[N, 3]`` vertex position inside each voxel, in voxel units.
        intersected_flag (`torch.Tensor`): ``[N, 3]`` bool, whether the surface crosses the voxel's x/y/z dual edge.
        split_weight (`torch.Tensor`, *optional*): ``[N, 1]`` or ``[N]`` per-voxel weight that picks the quad
            diagonal; ``None`` uses upstream's normal-based rule (see :func:`_split_by_normals`).
        aabb (`list`, `tuple`, `np.ndarray` or `torch.Tensor`): ``[2, 3]`` box corners; row 0 is the grid origin.
        voxel_size (`float` or 3 values, *optional*): voxel edge length; derives ``grid_size`` from ``aabb``.
        grid_size (`int` or 3 values, *optional*): voxels per axis; used when ``voxel_size`` is ``None``.
        train (`bool`, *optional*, defaults to `False`): must be `False`.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: vertices ``[N, 3]`` (``(coords + dual_vertices) · voxel_size +
        aabb[0]``, every voxel, used or not) and faces ``[2L, 3]`` int32 for the ``L`` complete quads, in upstream's
        order: voxel by voxel, axes x, y, z, two triangles per quad.
    """
    if train:
        raise ValueError(
            "flexible_dual_grid_to_mesh(train=True) is not ported (it adds training-only mid-vertices); "
            "call it with train=False"
        )
    device = coords.device
    aabb = _as_float_tensor(aabb, device)
    if aabb.shape != (2, 3):
        raise ValueError(f"aabb must be [2, 3] (min and max corner), got shape {tuple(aabb.shape)}")
    voxel_size, grid_size = _resolve_voxel_and_grid_size(aabb, voxel_size, grid_size, device)

    vertices = (coords.float() + dual_vertices) * voxel_size + aabb[0].reshape(1, 3)
    quads = _find_complete_quads(coords, intersected_flag, grid_size)
    if split_weight is None:
        use_split_02 = _split_by_normals(vertices, quads)
    else:
        use_split_02 = _split_by_weights(split_weight, quads, coords.shape[0])
    split_02, split_13 = _split_patterns(device)
    faces = torch.where(use_split_02.unsqueeze(1), quads[:, split_02], quads[:, split_13])
    return vertices, faces.reshape(-1, 3).int()


def _find_complete_quads(coords: torch.Tensor, intersected_flag: torch.Tensor, grid_size: torch.Tensor) -> torch.Tensor:
    """``[L, 4]`` int64 voxel rows of each flagged dual edge whose 4 voxels exist and lie inside the grid.

    Flagged (voxel, axis) pairs come out voxel-major, axes in x, y, z order, as upstream's boolean mask does.
    """
    voxel_rows, axes = intersected_flag.nonzero(as_tuple=True)
    corners = coords.long()[voxel_rows].unsqueeze(1) + _quad_offsets(coords.device)[axes]  # [M, 4, 3]
    positions, found = lookup_voxels(build_voxel_index(coords), corners)
    inside_grid = ((corners >= 0) & (corners < grid_size)).all(dim=-1)  # upstream's lookup rejects outside voxels
    complete = (found & inside_grid).all(dim=1)
    return positions[complete]


def _split_by_weights(split_weight: torch.Tensor, quads: torch.Tensor, num_voxels: int) -> torch.Tensor:
    """Upstream's learned split: diagonal 0-2 where ``w0·w2 > w1·w3``, else 1-3 (ties go to 1-3)."""
    if split_weight.numel() != num_voxels:
        raise ValueError(
            f"split_weight must hold one value per voxel ({num_voxels}), got shape {tuple(split_weight.shape)}; "
            "pass the decoder's softplus output, [N, 1]"
        )
    w = split_weight.reshape(-1)[quads]
    return w[:, 0] * w[:, 2] > w[:, 1] * w[:, 3]


def _split_by_normals(vertices: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
    """Upstream's split without weights, as written: diagonal 0-2 unless triangle (0, 1, 2) is degenerate.

    Upstream means to keep the split whose two triangle normals agree best, but for each candidate it takes the
    normals of index slots (0, 1, 2) and (1, 2, 3) of the 6-index list. For ``SPLIT_02`` both are triangle
    (0, 1, 2), so its score is ``|n·n'|`` with ``n' = n`` up to rounding; for ``SPLIT_13`` the second "triangle"
    is (1, 3, 3), whose cross product is exactly zero, so its score is 0. Upstream's ``score_02 > score_13`` is
    therefore ``score_02 > 0``, which is computed here with upstream's arithmetic.
    """
    v0, v1, v2 = (vertices[quads[:, k]] for k in range(3))
    normal = torch.linalg.cross(v1 - v0, v2 - v0)
    same_normal_again = torch.linalg.cross(v2 - v1, v0 - v1)
    return (normal * same_normal_again).sum(dim=1).abs() > 0


def _resolve_voxel_and_grid_size(
    aabb: torch.Tensor,
    voxel_size: float | list | tuple | np.ndarray | torch.Tensor | None,
    grid_size: int | list | tuple | np.ndarray | torch.Tensor | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's rule: ``voxel_size`` wins and sets ``grid_size = round(extent / voxel_size)``; else the reverse."""
    if voxel_size is not None:
        voxel_size = _as_xyz(_as_float_tensor(voxel_size, device), "voxel_size")
        return voxel_size, ((aabb[1] - aabb[0]) / voxel_size).round().int()
    if grid_size is None:
        raise ValueError("flexible_dual_grid_to_mesh needs voxel_size or grid_size; pass grid_size=<resolution>")
    if not isinstance(grid_size, torch.Tensor):
        grid_size = torch.tensor(np.asarray(grid_size), dtype=torch.int32, device=device)
    grid_size = _as_xyz(grid_size.to(device), "grid_size")
    return (aabb[1] - aabb[0]) / grid_size, grid_size


def _as_float_tensor(value: float | list | tuple | np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Tensors keep their dtype (as upstream); Python and NumPy values become float32, as upstream makes them."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return torch.tensor(np.asarray(value), dtype=torch.float32, device=device)


def _as_xyz(value: torch.Tensor, name: str) -> torch.Tensor:
    """A scalar becomes the same value on x, y and z; anything else must have 3 values."""
    if value.dim() == 0:
        return value.expand(3)
    if value.shape != (3,):
        raise ValueError(f"{name} must be a number or 3 values (x, y, z), got shape {tuple(value.shape)}")
    return value


@functools.cache
def _quad_offsets(device: torch.device) -> torch.Tensor:
    return torch.tensor(QUAD_OFFSETS, dtype=torch.long, device=device)


@functools.cache
def _split_patterns(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.tensor(SPLIT_02, dtype=torch.long, device=device),
        torch.tensor(SPLIT_13, dtype=torch.long, device=device),
    )
