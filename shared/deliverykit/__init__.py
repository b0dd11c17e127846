"""deliverykit: the helpers every Ascend NPU delivery shares, in three layers.

- **Runtime** (this package's top level; what ``inference.py`` uses): ``device`` (resolve and probe a device, and
  ``backend(device)``, the one object behind synchronize / empty_cache / memory counters / dtype policy), ``memory``
  (resident-set and peak-growth measurements), ``memory_plans`` (which ``--memory`` plan a run takes, by free device
  memory), ``ops`` (NPU-only kernels with CPU references), ``cpu_tasks``
  (independent CPU tasks on single-threaded workers), ``compile`` (the ``torch.compile`` backend per device),
  ``timing``, ``errors`` (exit codes), ``files`` (outputs checked first and
  committed together), ``images``, ``video`` (frames → H.264 mp4 via PyAV), ``cli`` (the shared flags), ``batch`` and
  ``distributed`` (many requests, several ranks), ``report`` (run reports and evidence lines), ``random_weights`` (smoke
  weights), ``compare`` (metrics and verdicts), ``imports``, ``process``, and ``testing`` (pytest helpers the
  deliveries' tests share).
- **Run-time asset checks** (:mod:`deliverykit.assets`): weights manifests and the check before loading, the pinned
  upstream checkout and its patches.
- **Maintainer tools** (:mod:`deliverykit.tools`): the ``deliverykit`` command line, README tables from results JSON,
  publishing one delivery as a standalone tree.

Lower layers never import higher ones. Submodules are imported on use so that ``import deliverykit`` never imports
torch.
"""

__version__ = "0.1.0"
