"""Memory plans of the image → 3D pipeline: which models stay on the device in each stage (``--memory``).

Model sizes are the released safetensors' bytes in ``weights-manifest.json``: upstream holds every model in its
stored dtype (flows bf16, SC-VAE decoders fp16, DINOv3 fp32), and ``tests/test_full_size.py`` checks those bytes
against the architectures built on the meta device. A stage's workspace is an estimate from its flow tokens or its
decoded voxels (:class:`Stage`) for an asset of typical size (:data:`ASSET_SIZES`), not yet measured on a 910B; a
larger asset needs more.

Plans:

- ``none``: every model of ``pipeline.json``, DINOv3 and, once an image without alpha needs it, the
  background-removal model stay on the device (upstream's ``low_vram`` off).
- ``stage-offload``: only the running stage's model is on the device (upstream's ``low_vram``: ``model.to(device)``
  … ``model.cpu()`` around each use). On an accelerator the others wait in host memory and each stage copies its
  model in; on a CPU host, where they would all sit in host memory, they wait on disk: :mod:`.offload` loads a large
  model when its stage uses it and frees it after.
- ``auto``: ``none`` where the device's free memory holds it for every pipeline type the process may run, else
  ``stage-offload``; the CPU gets ``stage-offload``.

A cascade then degrades as upstream lets it (:func:`token_budget`): its ``max_num_tokens``, the tokens of the 1024
flows below which upstream keeps the output grid (else lowering it by 128, down to 1024), is what the free memory
holds by the same estimates, at most upstream's default.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, NamedTuple

from deliverykit.assets.manifest import load_manifest
from deliverykit.device import device_type, free_memory, half_compute_dtype
from deliverykit.memory_plans import GB, AutoRows, choose_plan

from .full_size import model_config
from .loader import MANIFEST
from .options import MEMORY_CHOICES, MEMORY_PLANS, PIPELINE_TYPES
from .tiny import released_pipeline_config

if TYPE_CHECKING:
    import torch

NONE, STAGE_OFFLOAD = MEMORY_PLANS
HOST, DISK = "host memory", "disk"  # where the models off the device wait under stage-offload
CONDITIONING_MODEL, REMBG_MODEL = "image_cond_model", "rembg_model"  # their components in the manifest
SPARSE_STRUCTURE_TOKENS = 16**3  # the sparse-structure flow's dense latent
OUTPUT_RESOLUTION = {"512": 512, "1024": 1024, "1024_cascade": 1024, "1536_cascade": 1536}
UPSTREAM_MAX_NUM_TOKENS = 49_152  # Trellis2ImageTo3DPipeline.run()'s max_num_tokens
CASCADE_UPSAMPLE = "decoder:shape_slat_decoder.upsample"  # the stages after it are sized by the cascade's grid


class AssetSize(NamedTuple):
    """A typical asset at one output resolution: tokens of each SLat flow, voxels the decoders output."""

    tokens: int
    voxels: int
    source: str


ASSET_SIZES = {
    512: AssetSize(2_400, 715_975, "results/pipeline_full.json (the 512 run on the paper's ~9.6 K-token asset, CPU)"),
    1024: AssetSize(10_466, 3_100_000, "issue T4: a 1024 run's tokens per 1024 flow and decoded voxels"),
}
# 1536: the 1024 asset's surface scaled by (1536 / 1024)², tokens below upstream's max_num_tokens (49,152), so the
# cascade keeps the 1536 grid
SURFACE_SCALED = 1536
# Decoder workspace, an estimate: the last upsampling block (128 → 64 channels, fp16) holds its parents' 8 × 64-channel
# convolution output, the children's features, an fp32 norm, the skip and the convolution's output (≈ 0.5 KiB per
# output voxel), the neighbour map (≈ 90 B), and while the texture decoder runs the shape decoder's mesh: 1 KiB ...
DECODER_BYTES_PER_VOXEL = 1024
# ... plus the sparse convolutions' gather and product buffers, bounded per block of rows: at most 65,536 rows ×
# ~10.5 neighbours (a surface) × (512 + 512 channels) × 2 bytes at the 512-channel level
DECODER_BLOCKS_GB = 1.5


def asset_size(resolution: int) -> AssetSize:
    """The typical asset at output ``resolution`` (:data:`ASSET_SIZES`; 1536 scaled from 1024 by its surface)."""
    if resolution in ASSET_SIZES:
        return ASSET_SIZES[resolution]
    tokens, voxels, _ = ASSET_SIZES[1024]
    scale = (resolution / 1024) ** 2
    return AssetSize(round(tokens * scale), round(voxels * scale), f"the 1024 asset's surface × {scale:g}")


@functools.cache
def flow_bytes_per_token() -> int:
    """Activations per token of one SLat flow block in bf16, from the released flow's configuration: the residual,
    its norm, q, k, v and the attention output (six rows of ``model_channels``) and the MLP's hidden layer before and
    after GELU (two rows of ``model_channels × mlp_ratio``). The blocks run one at a time, and guidance runs the
    conditional and unconditional passes one after the other."""
    args = model_config("shape_slat_flow_model_1024")[1]
    channels = args["model_channels"]
    return (6 * channels + 2 * int(channels * args["mlp_ratio"])) * 2


@functools.cache
def model_gb() -> dict[str, float]:
    """GB on the device of each model the image → 3D pipeline can load, by its component in the manifest: the bytes
    of its required safetensors files (for background removal, RMBG-2.0)."""
    sizes: dict[str, float] = {}
    for model in load_manifest(MANIFEST, validate=False).models:
        for file in model.files:
            if file.required and file.path.endswith(".safetensors"):
                sizes[file.component] = sizes.get(file.component, 0.0) + file.bytes / GB
    return sizes


def resident_models() -> tuple[str, ...]:
    """What ``none`` keeps on the device: every model of ``pipeline.json`` (upstream moves them all, whatever the
    pipeline type), DINOv3 and the background-removal model."""
    return (*released_pipeline_config()["args"]["models"], CONDITIONING_MODEL, REMBG_MODEL)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of upstream's ``run()``: the models it uses, and the tokens (a flow) or output voxels (a decoder)
    that size its workspace."""

    name: str
    models: tuple[str, ...]
    tokens: int = 0
    voxels: int = 0

    @property
    def workspace_gb(self) -> float:
        decoder = self.voxels * DECODER_BYTES_PER_VOXEL / GB + DECODER_BLOCKS_GB if self.voxels else 0.0
        return self.tokens * flow_bytes_per_token() / GB + decoder

    @property
    def models_gb(self) -> float:
        return sum(model_gb()[name] for name in self.models)


def pipeline_stages(pipeline_type: str, asset: AssetSize | None = None) -> tuple[Stage, ...]:
    """The stages of upstream's ``run()`` for ``pipeline_type`` in order, named as the run's report names them
    (background removal only for an image without alpha); ``asset``: the output's size (default: typical)."""
    tokens, voxels, _ = asset or asset_size(OUTPUT_RESOLUTION[pipeline_type])
    flows = "512" if pipeline_type == "512" else "1024"
    shape = [Stage(f"flow:shape_slat_flow_model_{flows}", (f"shape_slat_flow_model_{flows}",), tokens=tokens)]
    if pipeline_type.endswith("_cascade"):  # the 512 flow, its voxels upsampled to the output grid, the 1024 flow
        low = asset_size(512)
        shape = [
            Stage("flow:shape_slat_flow_model_512", ("shape_slat_flow_model_512",), tokens=low.tokens),
            Stage(CASCADE_UPSAMPLE, ("shape_slat_decoder",), voxels=low.voxels),
            *shape,
        ]
    return (
        Stage("background removal", (REMBG_MODEL,)),
        Stage("conditioning", (CONDITIONING_MODEL,)),
        Stage("flow:sparse_structure_flow_model", ("sparse_structure_flow_model",), tokens=SPARSE_STRUCTURE_TOKENS),
        Stage("decoder:sparse_structure_decoder", ("sparse_structure_decoder",)),
        *shape,
        Stage(f"flow:tex_slat_flow_model_{flows}", (f"tex_slat_flow_model_{flows}",), tokens=tokens),
        Stage("decoder:shape_slat_decoder", ("shape_slat_decoder",), voxels=voxels),
        Stage("decoder:tex_slat_decoder", ("tex_slat_decoder",), voxels=voxels),
    )


def expected_peak_gb(plan: str, pipeline_type: str) -> float:
    """Device memory a run of ``pipeline_type`` under ``plan`` is expected to peak at (an estimate, see the module):
    the models on the device during its largest stage plus that stage's workspace."""
    stages = pipeline_stages(pipeline_type)
    if plan == NONE:
        resident = sum(model_gb()[name] for name in resident_models())
        return resident + max(stage.workspace_gb for stage in stages)
    return max(stage.models_gb + stage.workspace_gb for stage in stages)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """The chosen plan and why, for loading (:attr:`loads_per_stage`), placing the models and the run report."""

    name: str
    why: str
    pipeline_type: str  # of the pipeline types the process may run, the one with the largest peak
    expected_peak_gb: float | None  # device memory, estimated (see the module); None on the CPU
    offloaded_to: str | None  # where the models off the device wait: HOST, DISK (a CPU host), None (plan none)

    @property
    def loads_per_stage(self) -> bool:
        """Whether each large model is read from disk when its stage uses it (:mod:`.offload`)."""
        return self.offloaded_to == DISK

    def stages(self) -> list[dict[str, Any]]:
        """Per stage of :attr:`pipeline_type`: the models on the device, those of the run waiting elsewhere, and the
        stage's estimated workspace."""
        stages = pipeline_stages(self.pipeline_type)
        used = list(dict.fromkeys(name for stage in stages for name in stage.models))
        rows = []
        for stage in stages:
            resident = resident_models() if self.name == NONE else stage.models
            offloaded = [name for name in used if name not in resident]
            rows.append({"stage": stage.name, "resident": list(resident), "offloaded": offloaded,
                         "workspace_gb": round(stage.workspace_gb, 2)})  # fmt: skip
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "stages": self.stages()}


def make_plan(
    name: str, why: str, device: torch.device | str, pipeline_types: tuple[str, ...] = PIPELINE_TYPES
) -> MemoryPlan:
    """Plan ``name`` on ``device`` for a process that may run any of ``pipeline_types``."""
    if name not in MEMORY_PLANS:
        raise ValueError(f"memory plan {name!r}; expected one of {', '.join(MEMORY_PLANS)}")
    on_cpu = device_type(device) == "cpu"
    largest = max(pipeline_types, key=lambda pipeline_type: expected_peak_gb(name, pipeline_type))
    peak = None if on_cpu else round(expected_peak_gb(name, largest), 1)
    return MemoryPlan(name, why, largest, peak, None if name == NONE else DISK if on_cpu else HOST)


@dataclasses.dataclass(frozen=True)
class TokenBudget:
    """A cascade's ``max_num_tokens`` and why: upstream's default, the flag's, or what the free memory holds."""

    max_num_tokens: int
    why: str
    free_gb: float | None = None  # read when the run started; None: not read (no cascade, or the flag's budget)

    def degraded(self, pipeline_type: str, resolution: int, tokens: int) -> str | None:
        """The ``warning:`` line's text when the run's output grid is below ``pipeline_type``'s (``tokens``: of its
        1024 flows), else None."""
        asked = OUTPUT_RESOLUTION[pipeline_type]
        if resolution >= asked:
            return None
        return (
            f"{pipeline_type} ran at {resolution}³, not {asked}³: its 1024 flows had {tokens} tokens there and "
            f"max_num_tokens is {self.max_num_tokens} ({self.why}); upstream lowers the grid by 128 until they are "
            "below it, down to 1024³"
        )


def cascade_need_gb(plan: str, pipeline_type: str, tokens: int, device: torch.device | str) -> float:
    """Memory beyond what the run holds when it starts that the stages after the cascade's choice need, with
    ``tokens`` per 1024 flow and the typical asset's voxels per token: under ``none`` their workspace, under
    ``stage-offload`` their models too. The fp16 decoders count at the dtype ``device`` computes them in."""
    typical = asset_size(1024)
    asset = AssetSize(tokens, round(tokens * typical.voxels / typical.tokens), "a cascade's budget")
    stages = pipeline_stages(pipeline_type, asset)
    after = stages[[stage.name for stage in stages].index(CASCADE_UPSAMPLE) + 1 :]
    half_scale = half_compute_dtype(device).itemsize / 2

    def need(stage: Stage) -> float:
        scale = half_scale if stage.voxels else 1.0  # the decoders are the fp16 models, their activations fp16 too
        return scale * (stage.workspace_gb + (stage.models_gb if plan != NONE else 0.0))

    return max(need(stage) for stage in after)


def token_budget(
    plan: MemoryPlan, pipeline_type: str, device: torch.device | str, requested: int | None = None,
    free_bytes: int | None = None,
) -> TokenBudget:  # fmt: skip
    """``max_num_tokens`` for a run of ``pipeline_type``: ``requested`` (``--max-num-tokens``) as is; for a cascade
    on a device whose free memory is known (``free_bytes`` overrides the query), the most tokens whose
    :func:`cascade_need_gb` fits in it, at most upstream's default; else upstream's default."""
    if requested is not None:
        return TokenBudget(requested, "--max-num-tokens")
    free = free_memory(device) if free_bytes is None else free_bytes
    if free is None or not pipeline_type.endswith("_cascade"):
        return TokenBudget(UPSTREAM_MAX_NUM_TOKENS, "upstream's default")
    free_gb = free / GB
    fits, tokens = 0, UPSTREAM_MAX_NUM_TOKENS  # need grows with tokens: bisect for the last that fits
    while fits < tokens:
        middle = (fits + tokens + 1) // 2
        if cascade_need_gb(plan.name, pipeline_type, middle, device) <= free_gb:
            fits = middle
        else:
            tokens = middle - 1
    if fits == UPSTREAM_MAX_NUM_TOKENS:
        return TokenBudget(fits, f"upstream's default; {free_gb:.1f} GB free hold it", round(free_gb, 2))
    why = f"{free_gb:.1f} GB free hold {fits} tokens, estimated (README, Memory plans)"
    return TokenBudget(fits + 1, why, round(free_gb, 2))  # upstream keeps a grid whose tokens are below it


def auto_rows(pipeline_types: tuple[str, ...] = PIPELINE_TYPES) -> AutoRows:
    """``auto``'s choice: ``none`` from the free memory its largest peak needs, else ``stage-offload``."""
    need = round(max(expected_peak_gb(NONE, pipeline_type) for pipeline_type in pipeline_types), 1)
    return AutoRows(
        ((need, NONE, None), (0.0, STAGE_OFFLOAD, None)),
        cpu=(STAGE_OFFLOAD, "CPU: every model would sit in host memory; each is read from disk when its stage runs"),
        unknown=(STAGE_OFFLOAD, "only the running stage's model on the device"),
    )


def choose_memory_plan(
    device: torch.device | str,
    requested: str = "auto",
    *,
    pipeline_types: tuple[str, ...] = PIPELINE_TYPES,
    free_bytes: int | None = None,
) -> MemoryPlan:
    """The plan for ``device``: ``requested`` as is, or for ``auto`` by the device's free memory (``free_bytes``
    overrides the query: tests, or to plan for another card). ``pipeline_types``: those the process may run
    (``inference.py``: its ``--pipeline``; a server's requests: any)."""
    choice = choose_plan(device, requested, MEMORY_CHOICES, auto_rows(pipeline_types), free_bytes)
    return make_plan(choice.name, choice.why, device, pipeline_types)


def apply_memory_plan(pipeline: Any, plan: MemoryPlan, device: torch.device) -> None:
    """Upstream's ``low_vram`` as ``plan`` says, then the pipeline moved to ``device``: under ``none`` every model
    moves now; under ``stage-offload`` each moves in for its stage and out after."""
    pipeline.low_vram = plan.name != NONE
    pipeline.to(device)
