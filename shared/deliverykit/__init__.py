"""deliverykit: the helpers every Ascend NPU delivery shares.

One module per concern: ``imports`` (what is installed), ``device`` (resolve, probe, synchronize, memory),
``timing`` (synchronized benchmarks), ``compare`` (metrics and verdicts), ``report`` (run reports and evidence
lines), ``errors`` (exit codes), ``files`` (atomic output), ``readme`` (tables generated from results JSON),
``manifest`` and ``loadcheck`` (weights manifests; the check before loading), ``random_weights`` (smoke weights that
are the same on every torch version).
Submodules are imported on use so that ``import deliverykit`` never imports torch.
"""

__version__ = "0.1.0"
