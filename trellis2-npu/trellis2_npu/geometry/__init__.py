"""The CPU geometry library of the GLB export, without CUDA: the modules import only each other and two kernels of
the package (``voxel_lookup``, ``grid_sample``), never upstream or a model.

- ``export`` — the decoded mesh and voxel attributes → a textured GLB (upstream's ``to_glb``), calling:
- ``mesh_repair`` — hole filling, clean-up and simplification (CuMesh's);
- ``remesh`` — the narrow-band dual-contouring remesh, on ``distance_field`` (the distances to the grid corners) and
  ``dual_grid``;
- ``texture_bake`` — UV unwrapping (charts from ``uv_charts``, packed by xatlas) and PBR baking, snapping texels
  with ``closest_points``;
- ``*_cpu`` and ``host_sort`` — the host CPU's compiled kernels (numba) of ``closest_points``, ``distance_field``,
  ``grid_sample`` and the mesh repair's sorts, for float32 CPU tensors; the torch code stays for other devices;
- ``glb`` — assembling and writing the GLB.
- ``voxelize`` (mesh → flexible dual grid) and ``dual_grid`` (back): the texturing input and the shape decoder's
  last step (o-voxel's).
- ``mesh_io`` — the texturing input mesh read and checked; the outputs' PLY.
- ``render_preview`` (``preview.png``) and ``turntable`` (``preview.mp4``, on the same rasteriser).

Submodules are imported on use; importing this package imports nothing else.
"""
