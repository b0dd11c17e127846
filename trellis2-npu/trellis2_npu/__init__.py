"""TRELLIS.2-4B on Ascend NPU without CUDA extensions: model-specific code of the trellis2-npu delivery.

``inference.py`` (image → 3D; ``--mesh``: texturing an existing mesh) and ``scripts/conditioning.py`` (DINOv3
features) read top to bottom through:

- ``upstream`` — finding and importing the patched microsoft/TRELLIS.2 checkout (``deliverykit.assets.patches``).
- ``loader`` — loading: DINOv3 from its folder, the whole pipeline with upstream's ``from_pretrained``; every
  weights check (folder, model type, safetensors header, manifest) before loading.
- ``session`` — what every front end drives: ``Session`` (image → 3D) and ``TexturingSession`` (``--mesh``), each
  loaded once, running typed requests into an ``Asset`` and writing its files together.
- ``generate`` — one run of either upstream pipeline (``run()``) with per-stage timings and token counts, and the
  typed requests.
- ``options`` — what one run asks for: the flag groups inference.py and app.py share, the checks that need no model.
- ``page`` — what ``app.py``'s requests check and run (the uploads, one "Texture a mesh" request), without Gradio.
- ``serving`` — what ``serve.py`` serves through ``deliverykit.server``: ``/v1/assets`` jobs and Hunyuan3D-2.1's
  routes, each request checked as ``inference.py`` checks its flags, each job run by a ``session``.
- ``report`` — the run reports of both pipelines: evidence lines (keys listed once), report.json, tables.
- ``rembg`` — background removal for an image without alpha: which BiRefNet folder (``--rembg-model``,
  ``<root>/RMBG-2.0``, ``<root>/BiRefNet``), its checks before loading, its loading from that folder only.
- ``hooks`` — the only module the patches import: each patch calls one function here instead of a CUDA-only one.
- ``tiny`` — architecture-faithful models with seeded random weights in the released layouts (``--smoke``).
- ``full_size`` — the same at the released sizes (``--smoke full``), their sizes checked against the manifest.
- ``stages`` — named stages inside upstream's calls, timed by the run's stopwatch.
- ``memory`` — the memory plans (``--memory``): which models stay on the device in each stage, and the expected
  peak from the models' sizes.
- ``offload`` — on a CPU host, each large model loaded when its stage uses it and freed after.

Model maths, each tested without upstream: ``dinov3`` (the feature path), ``image``, ``precision``, ``attention``,
``rope``, ``sparse_conv``, ``grid_sample``, ``voxel_lookup``, ``preview`` (the conditioning's). The GLB export and
the meshes around it are the ``geometry`` package (its ``__init__`` maps it). Submodules are imported on use;
importing this package imports nothing else.
"""
