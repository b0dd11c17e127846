"""ursa-npu: URSA (baaivision/URSA, library ``diffnext``) on Ascend NPU, CUDA or CPU.

The patches in ``../patches`` hook the pinned upstream into this package, where the substance lives:
``fused_ops`` (SwiGLU / RMSNorm dispatch), ``attention`` (SDPA with grouped KV heads), ``compat``
(transformers 5 / diffusers 0.42, scheduler codebook file), ``upstream`` (finding the patched checkout), ``weights``
(folder checks and loading), ``tiny`` (a tiny random URSA in the real layout), ``pipeline`` (generation with a
memory-managed decode) and ``accuracy`` (metrics for a discrete-token model). The RoPE ``torch.compile`` backend per
device comes from ``deliverykit.compile``. Submodules are imported on use; nothing here imports diffnext or torch_npu
at import time.
"""

MODEL_ID = "BAAI/URSA-1.7B-IBQ512"
