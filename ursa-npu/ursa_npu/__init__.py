"""ursa-npu: URSA (baaivision/URSA, library ``diffnext``) on Ascend NPU, CUDA or CPU.

Module map (``inference.py`` runs them in this order):

- ``upstream``: finding the patched checkout (``--upstream`` / ``$URSA_SRC``) and importing its diffnext classes.
- ``loader``: checking a weights folder (before anything loads) and loading it component by component.
- ``tiny``: a tiny random URSA written in the real layout, for ``--smoke`` and the tests.
- ``generate``: one request (``ImageRequest``, checked before loading) → one image, with a memory-managed decode.
- ``report``: the run's evidence lines and ``report.json``, evidence keys listed once.
- ``serving``: OpenAI's images API over the session, for ``serve.py`` (imports FastAPI).
- ``hooks``: the one module the patches in ``../patches`` import; every call the patched diffnext makes into this
  package goes through it, to the model maths below or to ``deliverykit``.

Model maths: ``fused_ops`` (SwiGLU / RMSNorm dispatch), ``attention`` (SDPA with grouped KV heads), ``accuracy``
(metrics for a discrete-token model). The RoPE ``torch.compile`` backend per device comes from ``deliverykit.compile``.

Nothing here imports diffnext or torch_npu at import time, and ``upstream``, ``loader``, ``tiny``, ``generate`` and
``report`` do not import torch either: ``inference.py`` imports them at its top and still refuses bad arguments at
once.
"""

MODEL_ID = "BAAI/URSA-1.7B-IBQ512"
