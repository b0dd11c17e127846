"""Memory plans that fit Sulphur-2 (LTX-2.3, ≈ 23B parameters) on 32 GB and 64 GB Ascend cards.

bf16 sizes (sulphur.md §1, from LTX-2.3-shaped configs): transformer ≈ 38 GB, Gemma-3-12B text encoder ≈ 24 GB,
text connectors ≈ 6 GB, video/audio VAEs + vocoder ≈ 2 GB: 70 GB in all, more than any single 910B. The text encoder
runs once per prompt, so every plan below the largest cards encodes the prompt first and then frees Gemma
(:func:`encode_prompt_then_free`); the pipeline is then called with ``prompt_embeds`` and friends.

Plans (``--memory``):

- ``none``: everything resident on the device (optionally after freeing the text encoder).
- ``model-offload``: diffusers' ``enable_model_cpu_offload``: one whole component on the device at a time; the
  transformer alone (38 GB) still needs a card larger than 32 GB, so ``auto`` never prefers it over ``none``.
- ``group-offload``: text encoder freed, transformer streamed block by block (``enable_group_offload``, block level,
  one block per group, on a side stream on accelerators), connectors/VAEs/vocoder resident, VAE tiling on.
- ``sequential``: ``enable_sequential_cpu_offload``: every submodule streamed; the smallest footprint, the slowest.
- ``auto``: by free device memory, from :data:`AUTO_PLANS`; the CPU gets ``none``.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from deliverykit.device import device_type, empty_cache
from deliverykit.errors import DeliveryError, ExitCode
from deliverykit.memory_plans import AutoRows, choose_plan

from .options import MEMORY_CHOICES, MEMORY_PLANS

# bf16 component sizes in GB (parameters x 2 bytes, LTX-2.3 configs; sulphur.md §1, §6).
COMPONENT_GB = {"transformer": 38.0, "text_encoder": 24.0, "connectors": 6.0, "vae_audio_vae_vocoder": 2.0}
# The two-stage pipelines' parts (manifest bytes): the x2 upsampler, and the distilled LoRA that stays beside the
# transformer as peft layers. Stage 2 has the one-stage call's tokens, so the workspace is the same.
TWO_STAGE_GB = {"upsampler": 1.0, "distilled_lora": 0.7}
# Activations and workspace at the default 768x512x121 call: an estimate until measured on a 910B.
WORKSPACE_GB = 8.0
TRANSFORMER_BLOCKS = 48
LARGEST_LAYER_GB = 2.0  # Gemma-3's 262k x 3840 token embedding, the largest single layer sequential offload moves

PLANS, CHOICES = MEMORY_PLANS, MEMORY_CHOICES  # the --memory values (options)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """The chosen plan and why, for the run report and README."""

    name: str
    why: str
    expected_peak_gb: float | None  # device memory, estimate from COMPONENT_GB + WORKSPACE_GB; None on the CPU
    free_text_encoder: bool  # encode the prompt first, then drop Gemma
    vae_tiling: bool

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def offloads(self) -> bool:
        """Whether modules live on the host between their uses."""
        return self.name != "none"


def _peak_gb(name: str, free_text_encoder: bool, two_stage: bool = False) -> float:
    sizes = dict(COMPONENT_GB)
    parts = TWO_STAGE_GB if two_stage else {"upsampler": 0.0, "distilled_lora": 0.0}
    sizes["transformer"] += parts["distilled_lora"]
    if name == "none":
        resident = sum(sizes.values()) + parts["upsampler"] - (sizes["text_encoder"] if free_text_encoder else 0.0)
        # the text encoder runs alone before the rest is moved in, so it never adds to the denoising peak
        return max(resident, sizes["text_encoder"]) + WORKSPACE_GB
    if name == "model-offload":
        return max(sizes.values()) + WORKSPACE_GB
    if name == "group-offload":  # the upsampler comes in for its call, beside the resident connectors and VAEs
        two_blocks = 2 * sizes["transformer"] / TRANSFORMER_BLOCKS  # the running group and the prefetched one
        rest = sizes["connectors"] + sizes["vae_audio_vae_vocoder"]
        return rest + max(two_blocks, parts["upsampler"]) + WORKSPACE_GB
    return LARGEST_LAYER_GB + WORKSPACE_GB  # sequential: one layer at a time


# auto: the first row whose minimum free memory (GB) the device has (one-stage; a two-stage run adds its parts). A 64
# GB 910B (~61 GB free) runs resident once Gemma is freed (46 GB + workspace); a 32 GB 910B4 streams the transformer;
# below ~20 GB only sequential offload fits.
AUTO_ROWS: tuple[tuple[str, bool], ...] = (  # (plan, free_text_encoder), most resident first
    ("none", False),
    ("none", True),
    ("group-offload", True),
    ("sequential", True),
)


def auto_plans(two_stage: bool = False) -> list[tuple[float, str, bool]]:
    """(min free GB, plan, free_text_encoder) rows; the last one always fits."""
    rows = [(_peak_gb(name, free, two_stage), name, free) for name, free in AUTO_ROWS[:-1]]
    return [*rows, (0.0, *AUTO_ROWS[-1])]


def make_plan(
    name: str, why: str, *, free_text_encoder: bool | None = None, on_cpu: bool = False, two_stage: bool = False
) -> MemoryPlan:
    """A named plan with its defaults: group offload frees the text encoder and tiles the VAE, sequential tiles."""
    if name not in PLANS:
        raise ValueError(f"memory plan {name!r}; expected one of {', '.join(CHOICES)}")
    free = name == "group-offload" if free_text_encoder is None else free_text_encoder
    peak = None if on_cpu else round(_peak_gb(name, free, two_stage), 1)
    return MemoryPlan(name, why, peak, free, vae_tiling=name in ("group-offload", "sequential"))


def choose_memory_plan(
    device: torch.device | str, requested: str = "auto", *, free_bytes: int | None = None, two_stage: bool = False
) -> MemoryPlan:
    """The plan for ``device``: ``requested`` as is, or for ``auto`` the first :func:`auto_plans` row that fits.

    ``free_bytes`` overrides the device query (tests, or to plan for another card); ``two_stage``: the run loads
    the two-stage pipelines' upsampler and distilled LoRA too (:data:`TWO_STAGE_GB`).
    """
    rows = AutoRows(
        auto_plans(two_stage),
        cpu=("none", "CPU: host memory, nothing to offload to"),
        unknown=("none", "everything resident"),
    )
    choice = choose_plan(device, requested, CHOICES, rows, free_bytes)
    why = choice.why + (" after freeing the text encoder" if choice.option else "")
    on_cpu = device_type(device) == "cpu"
    return make_plan(choice.name, why, free_text_encoder=choice.option, on_cpu=on_cpu, two_stage=two_stage)


def plan_keeping_text_encoder(requested: str, device: torch.device, front_end: str) -> tuple[str, str | None]:
    """``(--memory, note)`` for a front end that encodes a prompt per request (the web demo, the server): a plan that
    frees Gemma-3 after the first prompt is replaced by ``model-offload`` under ``auto`` (the note says so), and
    refused by name (exit 2)."""
    plan = choose_memory_plan(device, requested)
    if not plan.free_text_encoder:
        return requested, None
    if requested != "auto":
        raise DeliveryError(
            f"--memory {requested} frees Gemma-3 after the first prompt, and {front_end} encodes one per request; "
            "pass --memory model-offload (or none on a large card)",
            ExitCode.USAGE,
        )
    return (
        "model-offload",
        f"memory plan: model-offload instead of {plan.name} ({front_end} keeps Gemma-3 for every request)",
    )


def check_plan_for_device(name: str, device: torch.device) -> None:
    """Usage error (exit 2) for ``--memory sequential`` on the CPU, before anything loads."""
    if name == "sequential" and torch.device(device).type == "cpu":
        raise DeliveryError(
            "--memory sequential streams weights from the host to an accelerator and fails inside accelerate on "
            "the CPU; use --memory none (or auto) with --device cpu",
            ExitCode.USAGE,
        )


def encode_prompt_then_free(
    pipe: Any,
    prompt: str | list[str],
    negative_prompt: str | list[str] | None = None,
    *,
    device: torch.device | str,
    max_sequence_length: int = 1024,
    num_videos_per_prompt: int = 1,
    do_classifier_free_guidance: bool = True,
) -> dict[str, torch.Tensor]:
    """Run Gemma once on ``device``, drop it from the pipeline, and return the pipeline's prompt keyword arguments.

    Returns ``prompt_embeds``, ``prompt_attention_mask`` and (with guidance) ``negative_prompt_embeds``,
    ``negative_prompt_attention_mask``: call the pipeline with these instead of ``prompt``/``negative_prompt``.
    """
    kwargs = {
        "prompt": prompt,
        "negative_prompt": negative_prompt,
        "max_sequence_length": max_sequence_length,
        "num_videos_per_prompt": num_videos_per_prompt,
        "do_classifier_free_guidance": do_classifier_free_guidance,
    }
    return encode_prompts_then_free(pipe, [kwargs], device=device)[0]


def encode_prompt(pipe: Any, kwargs: Mapping[str, Any], *, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The pipeline's prompt keyword arguments for one prompt (``kwargs``: as :func:`encode_prompt_then_free`'s),
    Gemma left where the memory plan put it."""
    guidance = kwargs.get("do_classifier_free_guidance", True)
    with torch.no_grad():
        embeds, mask, negative_embeds, negative_mask = pipe.encode_prompt(
            kwargs["prompt"],
            kwargs.get("negative_prompt"),
            do_classifier_free_guidance=guidance,
            num_videos_per_prompt=kwargs.get("num_videos_per_prompt", 1),
            max_sequence_length=kwargs.get("max_sequence_length", 1024),
            device=torch.device(device),
        )
    result = {"prompt_embeds": embeds, "prompt_attention_mask": mask}
    if guidance:
        result |= {"negative_prompt_embeds": negative_embeds, "negative_prompt_attention_mask": negative_mask}
    return result


def encode_prompts_then_free(
    pipe: Any, prompts: Sequence[Mapping[str, Any]], *, device: torch.device | str, to_host: bool = False
) -> list[dict[str, torch.Tensor]]:
    """:func:`encode_prompt_then_free` for several prompts (each its keyword arguments): Gemma moves to ``device``
    once and is dropped after the last. ``to_host``: each result goes to the CPU as it comes (a batch's embeddings
    wait there for their turn, ≈ 0.8 GB a prompt with guidance at 1024 tokens for Gemma-3-12B)."""
    pipe.text_encoder.to(device)
    results = []
    for kwargs in prompts:
        result = encode_prompt(pipe, kwargs, device=device)
        results.append({name: tensor.cpu() for name, tensor in result.items()} if to_host else result)
    pipe.register_modules(text_encoder=None)
    gc.collect()
    empty_cache(device)
    return results


def apply_memory_plan(pipe: Any, plan: MemoryPlan, device: torch.device | str) -> None:
    """Place the pipeline's components on ``device`` / the host as ``plan`` says (after any prompt encoding)."""
    device = torch.device(device)
    if plan.name == "none":
        pipe.to(device)
    elif plan.name == "model-offload":
        pipe.enable_model_cpu_offload(device=device)
    elif plan.name == "sequential":
        pipe.enable_sequential_cpu_offload(device=device)
    else:  # group-offload
        for name in ("connectors", "vae", "audio_vae", "vocoder", "text_encoder"):
            component = getattr(pipe, name, None)
            if component is not None:
                component.to(device)
        pipe.transformer.enable_group_offload(
            onload_device=device,
            offload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
            use_stream=device.type != "cpu",
        )
    if plan.vae_tiling:
        pipe.vae.enable_tiling()
