"""Sulphur-2-base (LTX-2.3 fine-tune) text/image-to-video + audio on diffusers 0.42.1 and Ascend NPUs.

``inference.py`` parses, checks, loads, prepares, generates and writes; the substance lives here, one concern a module:

- Loading: ``loader`` (one single file + a Gemma-3 folder -> an ``LTX2Pipeline``, strict and offline), built on
  ``checkpoint`` (header inspection: family, fp8, corrupt files), ``configs`` (the diffusers config of every
  component, from ltx-core's metadata or tensor shapes) and ``keymap`` (original <-> diffusers key names).
- One run: ``request`` (the flags or a ``--batch`` file -> checked ``GenerationRequest``s, before any load),
  ``generate`` (a loaded pipeline prepared once, then one timed pipeline call a request, checked for NaN/Inf),
  ``report`` (its evidence lines and ``report.json``), ``video_io`` (image in, mp4 and frames out); ``serving``
  (the ``/v1/videos`` API over the session, for ``serve.py``).
- ltx-pipelines' pipelines: ``stages`` (which pipeline, its parts, the two-stage hand-overs) and ``upsampler`` (the x2
  latent upsampler from its released file).
- What a run is set up with: ``presets``, ``sizes``, ``schedules`` (dev and distilled sigmas), ``memory`` (memory
  plans), ``attention`` (fused NPU attention), ``precision`` (float32 RoPE), ``lora``, ``reference_fixes`` (two
  diffusers code paths made to compute what ltx-core computes), ``parallel``, ``ulysses`` and ``split_decode``
  (several cards: guidance passes, sequence parallel, the tiled VAE decode's tiles over the ranks).
- Tiny models: ``tiny`` (the tiny random LTX-2.3 and its 8-head variant in memory, and written in the released
  single-file layout for ``--smoke``).
- Measurement only, never imported by inference: ``accuracy`` (CPU reference vs a device) and ``ltx_peer``
  (ltx-core / ltx-pipelines as the independent reference, a test-only peer checkout named by ``LTX2_SRC``).

There is no patched upstream checkout, so no ``upstream`` or ``hooks`` module: diffusers comes from PyPI (pinned in
``requirements.txt``) and is adapted at run time by this package (attention processors, ``reference_fixes``, the
loader); ltx-core is only a test-time peer, imported through ``deliverykit.assets.patches.import_from_checkout``.
"""

MODEL_ID = "SulphurAI/Sulphur-2-base"
