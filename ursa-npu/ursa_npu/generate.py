"""One text → image generation on the patched ``URSAPipeline``, with a memory-managed decode and stage timings.

Upstream keeps the 1.7B transformer on the device while the VQ decoder runs. Here the diffusion loop returns the
token ids (``output_type="latent"``), then the transformer is moved to the CPU **in place** (``.to()`` without
re-assigning ``pipe.transformer``: a re-assigned component ends up in the pipeline config and breaks a later
``save_pretrained``), the device cache is emptied, and the VAE decodes on the device. The next call moves the
transformer back. Nothing here does model maths: that is upstream's code and this package's hooks.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from deliverykit import device as devices
from deliverykit.errors import DeliveryError, ExitCode
from deliverykit.timing import Stopwatch

# upstream's defaults (URSAPipeline.__call__, the README's 512x512 release)
DEFAULT_STEPS = 50
DEFAULT_GUIDANCE = 7.0
DEFAULT_SIZE = 512  # URSA-1.7B-IBQ512 is trained at 512x512
DEFAULT_MAX_PROMPT_LENGTH = 320  # the real tokenizer window

if TYPE_CHECKING:  # torch arrives with the model: inference.py imports this module before it parses its arguments
    import numpy as np
    import torch


@dataclasses.dataclass(frozen=True)
class ImageRequest:
    """What one image is made from: the CLI flags of a single run, or one line of a ``--batch`` file."""

    prompt: str
    negative_prompt: str
    seed: int
    steps: int
    guidance: float
    height: int
    width: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Generation:
    """What one call produced and how long each stage took (milliseconds, synchronized with the device)."""

    image: np.ndarray  # uint8 [H, W, 3]
    token_ids: torch.Tensor  # int64 [T, h, w] on the CPU
    stages_ms: dict[str, float]
    steps: int
    peak_memory_bytes: int | None
    placement: list[devices.PlacementAudit]  # the transformer during diffusion, the VAE during decode

    @property
    def diffusion_ms(self) -> float:
        return self.stages_ms["diffusion"]

    @property
    def decode_ms(self) -> float:
        return self.stages_ms["vae_decode"]

    @property
    def iterations_per_s(self) -> float:
        return self.steps / (self.diffusion_ms / 1000.0)

    @property
    def total_ms(self) -> float:
        return sum(self.stages_ms.values())


def nearest_multiples(value: int, stride: int) -> list[int]:
    """The multiples of ``stride`` closest to ``value`` (one or two, at least ``stride``)."""
    below = max(stride, value // stride * stride)
    above = below if value <= below else below + stride
    return sorted({below, above})


def check_image_size(height: int, width: int, stride: int) -> None:
    """Raise a usage error naming the nearest valid sizes unless both sides are positive multiples of the VQ stride."""
    for name, value in (("height", height), ("width", width)):
        if value < stride or value % stride:
            choices = " or ".join(str(v) for v in nearest_multiples(value, stride))
            raise DeliveryError(
                f"--{name} {value} is not supported: the VQ model needs a multiple of its stride {stride}; "
                f"nearest valid: {choices}",
                ExitCode.USAGE,
            )


def check_request(request: ImageRequest, stride: int) -> None:
    """Raise a usage error unless ``request`` can run: at least one step, a size the VQ model (``stride``) can make."""
    if request.steps < 1:
        raise DeliveryError(f"steps {request.steps}: need at least 1")
    check_image_size(request.height, request.width, stride)


def prompt_token_count(tokenizer: Any, prompt: str) -> int:
    """Tokens in ``prompt`` before the pipeline truncates it to ``max_prompt_length``."""
    return len(tokenizer(prompt, truncation=False).input_ids)


def generate(pipe: Any, request: ImageRequest, *, device: torch.device, max_prompt_length: int) -> Generation:
    """Run the diffusion loop on ``device``, offload the transformer, decode on ``device``; return image and timings.

    The generator lives on ``device`` (upstream draws the initial tokens and every jump there), so the same seed
    gives the same tokens on one device type, not across devices.
    """
    watch = Stopwatch(device)
    devices.reset_peak_memory_stats(device)
    with watch.stage("transformer_to_device"):
        pipe.transformer.to(device)  # in place: never re-assign a pipeline component
    generator = devices.make_generator(request.seed, device)
    with watch.stage("diffusion"):
        ids = pipe(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            height=request.height,
            width=request.width,
            num_inference_steps=request.steps,
            guidance_scale=request.guidance,
            generator=generator,
            max_prompt_length=max_prompt_length,
            output_type="latent",
        ).frames
    placement = [devices.audit_placement(pipe.transformer, device)]  # before the offload below moves it
    with watch.stage("transformer_offload"):
        pipe.transformer.to("cpu")
        devices.empty_cache(device)
    with watch.stage("vae_decode"):
        pixels = pipe.image_processor.decode_latents(pipe.vae, ids, vae_batch_size=1)
        image = pipe.image_processor.postprocess(pixels, output_type="np")[0]
    placement.append(devices.audit_placement(pipe.vae, device))
    peak = devices.max_memory_allocated(device)
    return Generation(image, ids[0].cpu(), watch.stages, request.steps, peak, placement)
