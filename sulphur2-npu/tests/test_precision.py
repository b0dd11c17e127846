"""float32 RoPE policy: where it applies, that the forward really changes, its cost, and no float64 op left."""

from __future__ import annotations

import pytest
import torch

from sulphur2_npu.precision import (
    apply_rope_precision_policy,
    measure_rope_precision_cost,
    ops_using_dtype,
    set_rope_double_precision,
)
from sulphur2_npu.tiny import TINY_CALL, tiny_pipeline

# transformer: video, audio, and the two cross-attention RoPEs; connectors: one per modality
ROPE_MODULES = 6


def _double_precision_flags(pipe) -> set[bool]:
    modules = [m for c in (pipe.transformer, pipe.connectors) for m in c.modules() if hasattr(m, "double_precision")]
    assert len(modules) == ROPE_MODULES
    return {m.double_precision for m in modules}


@pytest.mark.parametrize(
    ("device", "force", "expected"),
    [("cpu", False, "float64"), ("cuda:0", False, "float64"), ("npu:0", False, "float32"), ("cpu", True, "float32")],
)
def test_policy_uses_float32_only_on_npu_or_when_forced(device, force, expected):
    pipe = tiny_pipeline(0)
    assert apply_rope_precision_policy(pipe, device, force_float32=force) == expected
    double = expected == "float64"
    assert _double_precision_flags(pipe) == {double}
    assert pipe.transformer.config.rope_double_precision is double
    assert pipe.connectors.config.rope_double_precision is double


def test_float32_rope_changes_outputs_slightly_and_the_setting_is_restored():
    pipe = tiny_pipeline(0)
    cost = measure_rope_precision_cost(pipe, TINY_CALL, full_size_latent_grid=(2, 2, 3))
    assert _double_precision_flags(pipe) == {True}
    errors = [
        *cost["rope"].values(),
        *cost["transformer"].values(),
        *cost["pipeline"].values(),
        cost["rope_full_size"]["cos"],
    ]
    # > 0: the flag reached the forward (a flag that is never read would give identical outputs)
    assert all(e["max_abs"] > 0.0 for e in errors), cost
    # RoPE tables: float32 rounding of theta**x (up to ~1.6e4) times positions, seen in cos/sin to ~1e-3
    assert all(e["max_abs"] < 1e-2 and e["rel_l2"] < 1e-2 for e in cost["rope"].values()), cost
    outputs = [*cost["transformer"].values(), *cost["pipeline"].values()]
    assert all(e["rel_l2"] < 1e-4 for e in outputs), cost
    assert cost["rope_full_size"]["rope_dim"] == 4096


def test_no_float64_op_left_after_the_npu_policy():
    pipe = tiny_pipeline(0)

    def run():
        with torch.no_grad():
            pipe(**TINY_CALL, generator=torch.Generator().manual_seed(42))

    before = ops_using_dtype(run)
    assert before.get("pow", 0) > 0, before  # the census sees the float64 RoPE frequencies
    set_rope_double_precision(pipe, False)
    assert ops_using_dtype(run) == {}
