"""float32 RoPE frequencies on NPUs, and what that costs, measured on CPU.

Why: LTX-2's configs set ``rope_double_precision=True``, so every forward computes the RoPE frequency vector
``theta ** linspace(0, 1)`` in float64 (``transformer_ltx2.py`` ``LTX2AudioVideoRotaryPosEmbed.forward``,
``connectors.py`` ``LTX2RotaryPosEmbed1d.forward``), then casts it to float32. Ascend kernels commonly reject
DT_DOUBLE (diffusers#10428), so on an NPU the frequencies are computed in float32. The flag is read from each RoPE
module's ``double_precision`` attribute at forward time (the config value is only copied there in ``__init__``), so
the policy sets the attributes, and the configs too so that a saved model says what ran.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed
from diffusers.pipelines.ltx2.connectors import LTX2RotaryPosEmbed1d
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from deliverykit.compare import tensor_metrics
from deliverykit.device import supports_float64

ROPE_CLASSES = (LTX2AudioVideoRotaryPosEmbed, LTX2RotaryPosEmbed1d)
ROPE_COMPONENTS = ("transformer", "connectors")


def set_rope_double_precision(pipe: Any, enabled: bool) -> list[str]:
    """Compute RoPE frequencies in float64 (``enabled``) or float32; return the RoPE modules changed.

    Sets every RoPE module's ``double_precision`` (what the forward reads) and the ``rope_double_precision`` config
    entry of the transformer and connectors.
    """
    changed = []
    for component_name in ROPE_COMPONENTS:
        component = getattr(pipe, component_name, None)
        if component is None:
            continue
        for name, module in component.named_modules():
            if isinstance(module, ROPE_CLASSES):
                module.double_precision = enabled
                changed.append(f"{component_name}.{name}")
        if "rope_double_precision" in component.config:
            component.register_to_config(rope_double_precision=enabled)
    return changed


def apply_rope_precision_policy(pipe: Any, device: torch.device | str, *, force_float32: bool = False) -> str:
    """float32 RoPE where ``device`` does not support float64 (NPU) or when forced; else leave the config as is.

    Returns the precision now in effect (``"float32"`` or ``"float64"``) for the run report.
    """
    if force_float32 or not supports_float64(device):
        set_rope_double_precision(pipe, False)
        return "float32"
    return "float64" if pipe.transformer.rope.double_precision else "float32"


class _DtypeCensus(TorchDispatchMode):
    """Counts the ops that read or write a tensor of one dtype."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        if any(t.dtype == self.dtype for t in tensors):
            self.ops[str(func.overloadpacket.__name__)] += 1
        return out


def ops_using_dtype(fn: Callable[[], Any], dtype: torch.dtype = torch.float64) -> dict[str, int]:
    """Run ``fn()`` and count, per aten op, the calls that read or produced a ``dtype`` tensor."""
    with _DtypeCensus(dtype) as census:
        fn()
    return dict(census.ops)


class _Captured(Exception):
    pass


def capture_transformer_call(pipe: Any, call_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the pipeline's first transformer call (the pipeline stops there)."""
    captured: dict[str, Any] = {}

    def grab(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        captured.update(kwargs)
        raise _Captured

    handle = pipe.transformer.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with contextlib.suppress(_Captured):
            pipe(**call_kwargs)
    finally:
        handle.remove()
    if not captured:
        raise RuntimeError("the pipeline finished without calling its transformer")
    return captured


@contextlib.contextmanager
def _rope_precision(pipe: Any, enabled: bool) -> Iterator[None]:
    before = {module: module.double_precision for module in _rope_modules(pipe)}
    set_rope_double_precision(pipe, enabled)
    try:
        yield
    finally:
        for module, value in before.items():
            module.double_precision = value


def _rope_modules(pipe: Any) -> list[torch.nn.Module]:
    components = [getattr(pipe, name) for name in ROPE_COMPONENTS if getattr(pipe, name, None) is not None]
    return [m for c in components for m in c.modules() if isinstance(m, ROPE_CLASSES)]


def _errors(reference: torch.Tensor, candidate: torch.Tensor) -> dict[str, float]:
    metrics = tensor_metrics(reference, candidate)
    return {"max_abs": metrics["max_abs"], "rel_l2": metrics["rel_l2"]}


def _rope_tables(rope: torch.nn.Module, coords: torch.Tensor) -> dict[str, torch.Tensor]:
    cos, sin = rope(coords, device="cpu")
    return {"cos": cos, "sin": sin}


def measure_rope_precision_cost(
    pipe: Any, call_kwargs: dict[str, Any], *, seed: int = 42, full_size_latent_grid: tuple[int, int, int] | None = None
) -> dict[str, Any]:
    """Errors of float32 against float64 RoPE frequencies on one pipeline (CPU, CPU generator ``seed``).

    Keys (each a ``{max_abs, rel_l2}`` dict): ``rope`` (the video RoPE cos/sin of this transformer for the call's
    size), ``transformer`` (``video``/``audio`` output of the first denoising forward, same inputs), ``pipeline``
    (``frames``/``audio`` after the whole call). ``full_size_latent_grid=(frames, height, width)`` in latent units
    adds ``rope_full_size``: the video RoPE at the real 22B model's width (32 heads × 128), which depends on the
    config, not on the weights. The pipeline's own RoPE setting is restored afterwards.
    """

    def generator() -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    inputs = capture_transformer_call(pipe, {**call_kwargs, "generator": generator()})
    coords = inputs["video_coords"]  # LTX2 pipelines pass the patch coordinates explicitly
    outputs: dict[bool, dict[str, Any]] = {}
    for double in (True, False):
        with _rope_precision(pipe, double), torch.no_grad():
            rope_tables = _rope_tables(pipe.transformer.rope, coords)
            video, audio = pipe.transformer(**{**inputs, "return_dict": False})
            result = pipe(**call_kwargs, generator=generator())
        outputs[double] = {"rope": rope_tables, "video": video, "audio": audio, "result": result}
    ref, cand = outputs[True], outputs[False]
    report: dict[str, Any] = {
        "rope": {name: _errors(ref["rope"][name], cand["rope"][name]) for name in ("cos", "sin")},
        "transformer": {name: _errors(ref[name], cand[name]) for name in ("video", "audio")},
        "pipeline": {
            "frames": _errors(torch.as_tensor(ref["result"].frames), torch.as_tensor(cand["result"].frames)),
            "audio": _errors(torch.as_tensor(ref["result"].audio), torch.as_tensor(cand["result"].audio)),
        },
    }
    if full_size_latent_grid is not None:
        report["rope_full_size"] = full_size_rope_cost(full_size_latent_grid)
    return report


def full_size_rope_cost(latent_grid: tuple[int, int, int]) -> dict[str, Any]:
    """float32 vs float64 video RoPE cos/sin of the full-size transformer (built on the meta device: no weights)."""
    from diffusers import LTX2VideoTransformer3DModel

    with torch.device("meta"):
        transformer = LTX2VideoTransformer3DModel(rope_type="split", num_layers=0)  # the RoPE needs no blocks
    rope = transformer.rope
    frames, height, width = latent_grid
    coords = rope.prepare_video_coords(1, frames, height, width, "cpu")
    tables = {}
    for double in (True, False):
        rope.double_precision = double
        tables[double] = _rope_tables(rope, coords)
    return {
        "latent_grid": list(latent_grid),
        "rope_dim": rope.dim,
        **{name: _errors(tables[True][name], tables[False][name]) for name in ("cos", "sin")},
    }
