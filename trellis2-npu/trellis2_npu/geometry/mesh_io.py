"""Reading the texturing input mesh (checked), writing the pipeline's outputs: the mesh as binary PLY and the
per-voxel PBR attributes as safetensors.

``MeshWithVoxel`` (upstream) carries ``vertices [V, 3]`` float, ``faces [F, 3]`` int, ``coords [N, 3]`` voxel
indices at the output resolution and ``attrs [N, 6]`` in ``[0, 1]`` with the layout :data:`PBR_LAYOUT`. Vertices are
in upstream's frame (the ``[-0.5, 0.5]³`` box, y up is not applied: GLB export rotates, this does not).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
import trimesh
from safetensors.torch import save

from deliverykit.errors import InputError

PBR_LAYOUT = {"base_color": [0, 3], "metallic": [3, 4], "roughness": [4, 5], "alpha": [5, 6]}
MESH_FORMATS = (".glb", ".gltf", ".obj", ".ply")  # upstream's app_texturing.py accepts these


def read_mesh(path: str | os.PathLike) -> trimesh.Trimesh:
    """The mesh in ``path`` as one ``trimesh.Trimesh`` (a scene's meshes joined, node transforms applied, as
    upstream's app does with ``to_mesh()``), refused with one :class:`InputError` line (exit 3) when it is missing,
    of another format, unreadable, without faces, with NaN/Inf or out-of-range indices, or flat to a point."""
    path = Path(path)
    fix = f"pass a triangle mesh file ({', '.join(MESH_FORMATS)}) to --mesh"
    if not path.exists():
        raise InputError(f"input mesh {path} does not exist; {fix}")
    if not path.is_file():
        raise InputError(f"input mesh {path} is not a file; {fix}")
    if path.suffix.lower() not in MESH_FORMATS:
        raise InputError(f"input mesh {path}: unsupported extension {path.suffix or '(none)'!r}; {fix}")
    try:
        loaded = trimesh.load(path, file_type=path.suffix.lower()[1:], force="mesh", process=False)
    except Exception as err:  # trimesh raises whatever its parsers raise on a damaged file
        raise InputError(f"cannot read {path} as a mesh ({type(err).__name__}: {err}); {fix}") from err
    if not isinstance(loaded, trimesh.Trimesh) or len(getattr(loaded, "faces", ())) == 0:
        raise InputError(f"input mesh {path} has no faces (a point cloud or an empty scene?); {fix}")
    vertices, faces = np.asarray(loaded.vertices, dtype=np.float64), np.asarray(loaded.faces)
    if not np.isfinite(vertices).all():
        raise InputError(f"input mesh {path} has NaN/Inf vertex positions; repair or re-export it")
    if faces.min() < 0 or faces.max() >= len(vertices):
        raise InputError(f"input mesh {path} has face indices outside its {len(vertices)} vertices; re-export it")
    used = vertices[np.unique(faces)]
    if float((used.max(axis=0) - used.min(axis=0)).max()) <= 0:
        raise InputError(f"input mesh {path} has zero extent (every face on one point); {fix}")
    return trimesh.Trimesh(vertices=vertices, faces=faces, process=False)


def write_ply(path: str | os.PathLike, vertices: torch.Tensor, faces: torch.Tensor) -> None:
    """Binary little-endian PLY: float32 x, y, z per vertex; uchar count + int32 indices per triangle."""
    vertices = vertices.detach().to("cpu", torch.float32).numpy()
    faces = faces.detach().to("cpu", torch.int32).numpy()
    if vertices.ndim != 2 or vertices.shape[1] != 3 or faces.ndim != 2 or faces.shape[1] != 3:
        raise ValueError(f"vertices [V, 3] and faces [F, 3] expected, got {vertices.shape} and {faces.shape}")
    header = (
        "ply\nformat binary_little_endian 1.0\n"
        f"element vertex {len(vertices)}\nproperty float x\nproperty float y\nproperty float z\n"
        f"element face {len(faces)}\nproperty list uchar int vertex_indices\nend_header\n"
    )
    face_records = np.empty(len(faces), dtype=[("n", "u1"), ("i", "<i4", (3,))])
    face_records["n"] = 3
    face_records["i"] = faces
    with open(path, "wb") as handle:
        handle.write(header.encode("ascii"))
        handle.write(vertices.astype("<f4").tobytes())
        handle.write(face_records.tobytes())


def read_ply(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read back a file of :func:`write_ply` (tests and checks): ``(vertices [V, 3], faces [F, 3])``."""
    data = Path(path).read_bytes()
    end = data.index(b"end_header\n") + len(b"end_header\n")
    lines = data[:end].decode("ascii").splitlines()
    counts = {line.split()[1]: int(line.split()[2]) for line in lines if line.startswith("element")}
    vertices = np.frombuffer(data, "<f4", counts["vertex"] * 3, end).reshape(-1, 3)
    records = np.frombuffer(data, [("n", "u1"), ("i", "<i4", (3,))], counts["face"], end + vertices.nbytes)
    return vertices, records["i"]


def save_voxels(path: str | os.PathLike, coords: torch.Tensor, attrs: torch.Tensor, resolution: int) -> None:
    """``coords`` (int32 ``[N, 3]``) and ``attrs`` (float32 ``[N, 6]``); the layout and voxel grid in the header.

    Serialized in memory and written by Python, so a full disk raises ``OSError`` (ENOSPC), which the output commit
    turns into its exit-6 line; safetensors' own writer reports it as a generic error.
    """
    data = save(
        {
            "coords": coords.detach().to("cpu", torch.int32).contiguous(),
            "attrs": attrs.detach().to("cpu", torch.float32).contiguous(),
        },
        metadata={
            "layout": json.dumps(PBR_LAYOUT),
            "resolution": str(resolution),
            "origin": "[-0.5, -0.5, -0.5]",
            "voxel_size": f"1/{resolution}",
        },
    )
    Path(path).write_bytes(data)
