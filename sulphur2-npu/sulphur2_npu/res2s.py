"""ltx-pipelines' res_2s sampler (``TI2VidTwoStagesHQPipeline``, ``two-stage-hq``) as a diffusers scheduler.

Sources: Lightricks/LTX-2 at 400fd310, ``packages/ltx-pipelines/src/ltx_pipelines/utils/samplers.py``
(``res2s_audio_video_denoising_loop``, ``_get_new_noise``), ``utils/res2s.py`` and ``packages/ltx-core/src/ltx_core/
components/diffusion_steps.py`` (``Res2sDiffusionStep``).

A res_2s step from σ_k to σ_k+1 evaluates the model twice, at σ_k and at the midpoint √(σ_k σ_k+1), and combines
the two x0 with Runge-Kutta weights from the φ functions of h = log(σ_k / σ_k+1). A schedule ending in 0 steps to
0.0011 instead, and one more evaluation there gives x0. :class:`Res2sScheduler` lists every evaluation in its
``timesteps`` and ``sigmas``, so diffusers' LTX-2 pipelines run their own loop (guidance, conditioning) unchanged:
n steps are 2n + 1 transformer calls and 2n + 1 step callbacks. ``step`` takes x0 back from the velocity the pipeline
hands it and returns the next evaluation's input, rounded to the model's dtype as ltx-core rounds its states.

Between the evaluations ltx-core injects SDE noise (η 0.5) from two generators that its ``DiffusionStage`` seeds
with the loop's default ``noise_seed`` -1 (steps) and 9999 (midpoints), whatever the run's seed; each draws a
state's whole noise in token order, video then audio, in float64, normalised over the tensor and then per sample.
The video and audio copies of a scheduler (diffusers' pipelines ``deepcopy`` it) share the two streams.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.schedulers.scheduling_flow_match_euler_discrete import FlowMatchEulerDiscreteSchedulerOutput

from deliverykit.device import backend

LAST_SIGMA = 0.0011  # what a schedule's terminal 0 steps to: "inject minimal sigma value to avoid division by zero"
STEP_SEED = -1  # res2s_audio_video_denoising_loop's noise_seed default; DiffusionStage passes none
SUBSTEP_SEED = STEP_SEED + 10000
ETA = 0.5  # SDE noise strength, steps and midpoints alike
MIDPOINT = 0.5  # c2: the second evaluation at σ_k^(1-c2) σ_k+1^c2
BONG_ROUNDS = 100  # anchor refinement, when h < BONG_MAX_H and σ_k > BONG_MIN_SIGMA
BONG_MAX_H, BONG_MIN_SIGMA = 0.5, 0.03


def phi(j: int, neg_h: float) -> float:
    """φ_j(z) = (e^z − Σ_{k<j} z^k / k!) / z^j at z = ``neg_h``; 1 / j! at 0."""
    if abs(neg_h) < 1e-10:
        return 1.0 / math.factorial(j)
    remainder = sum(neg_h**k / math.factorial(k) for k in range(j))
    return (math.exp(neg_h) - remainder) / (neg_h**j)


def coefficients(h: float) -> tuple[float, float, float]:
    """(a21, b1, b2): the midpoint's weight of the first x0 − x, and the two x0 weights of the full step."""
    b2 = phi(2, -h) / MIDPOINT
    return MIDPOINT * phi(1, -h * MIDPOINT), phi(1, -h) - b2, b2


class NoiseStreams:
    """The step and midpoint generators of one sampling run; a deep copy is the same object, so the video and audio
    schedulers draw from one pair of streams in the order the pipeline steps them (video, then audio)."""

    def __init__(self) -> None:
        self.step, self.substep = torch.Generator(), torch.Generator()
        self.reseed()

    def reseed(self) -> None:
        self.step.manual_seed(STEP_SEED)
        self.substep.manual_seed(SUBSTEP_SEED)

    def __deepcopy__(self, memo: dict[int, Any]) -> NoiseStreams:
        return self


def new_noise(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """ltx-pipelines' ``_get_new_noise``: float64 noise of ``shape`` (its state's ``[B, tokens, C]``) normalised over
    the tensor, then over each sample's tokens and channels. A CPU generator: the same numbers on every device."""
    noise = torch.randn(shape, generator=generator, dtype=torch.float64)
    noise = (noise - noise.mean()) / noise.std()
    return noise.sub_(noise.mean(dim=(-2, -1), keepdim=True)).div_(noise.std(dim=(-2, -1), keepdim=True))


def noise_like(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """:func:`new_noise` for what the pipeline steps: packed ``[B, tokens, C]`` as drawn, or diffusers'
    image-to-video frames after the first ``[B, C, F, H, W]`` (it steps the conditioned first frame apart), drawn
    for all F + 1 frames' tokens as ltx-core's state holds them and the first frame's dropped."""
    if sample.ndim == 3:
        return new_noise(tuple(sample.shape), generator)
    batch, channels, frames, height, width = sample.shape
    noise = new_noise((batch, (frames + 1) * height * width, channels), generator)[:, height * width :]
    return noise.reshape(batch, frames, height, width, channels).permute(0, 4, 1, 2, 3)


def sde_step(
    anchor: torch.Tensor, target: torch.Tensor, sigmas: torch.Tensor, noise: torch.Tensor, eta: float = ETA
) -> torch.Tensor:
    """``Res2sDiffusionStep.step`` from ``anchor`` at ``sigmas[0]`` towards the deterministic ``target`` at
    ``sigmas[1]``, with noise of strength ``eta`` (``get_sde_coeff`` given σ_up = η σ_next), in ``sigmas``' dtype as
    ltx-core computes it (float32 for a step, float64 for a midpoint)."""
    sigma, sigma_next = sigmas[0], sigmas[1]
    sigma_up = (sigma_next * eta).clamp(max=sigma_next * 0.9999)
    residual = (sigma_next**2 - sigma_up**2).clamp(min=0) ** 0.5
    alpha_ratio = (torch.ones_like(sigma_next) - sigma_next) + residual
    sigma_down = torch.nan_to_num(residual / alpha_ratio, nan=float(sigma_next))
    if sigma_up == 0 or sigma_next == 0:
        return target
    eps = (anchor - target) / (sigma - sigma_next)
    return alpha_ratio * (anchor - sigma * eps + sigma_down * eps) + sigma_up * noise.to(target)


@dataclasses.dataclass
class _Midpoint:
    """What the second evaluation of a step needs from the first."""

    anchor: torch.Tensor
    eps: torch.Tensor
    h: float
    b1: float
    b2: float


class Res2sScheduler(FlowMatchEulerDiscreteScheduler):
    """``FlowMatchEulerDiscreteScheduler`` whose σ schedule is sampled with res_2s (module docstring).

    ``set_timesteps`` computes the base schedule as its parent does (shift, stretch, given ``sigmas``) and lists the
    evaluations; ``state_dtype`` is the model's dtype (ltx-core's ``model_dtype``), which every state is rounded to.
    """

    state_dtype: torch.dtype = torch.float32

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.streams = NoiseStreams()
        self.steps: torch.Tensor = torch.zeros(0)
        self._midpoint: _Midpoint | None = None

    def set_timesteps(
        self,
        num_inference_steps: int | None = None,
        device: str | torch.device | None = None,
        sigmas: list[float] | None = None,
        mu: float | None = None,
        timesteps: list[float] | None = None,
    ) -> None:
        super().set_timesteps(num_inference_steps, device, sigmas, mu, timesteps)
        base = self.sigmas.float().cpu()
        if base[-1] != 0:
            raise ValueError(f"res_2s expects a schedule ending in 0, as diffusers appends it; got {base.tolist()}")
        self.steps = base = torch.cat([base[:-1], torch.tensor([LAST_SIGMA, 0.0])])
        wide = base.double()
        evaluations = []
        for k in range(len(base) - 2):
            evaluations += [wide[k], torch.sqrt(wide[k] * wide[k + 1])]
        evaluations.append(wide[-2])
        sigmas = torch.stack(evaluations).float()
        self.timesteps = (sigmas * self.config.num_train_timesteps).to(device)
        self.sigmas = torch.cat([sigmas, torch.zeros(1)]).to(device)
        self.num_inference_steps = len(sigmas)
        self.streams.reseed()
        self._midpoint = None

    def step(
        self, model_output: torch.Tensor, timestep: Any, sample: torch.Tensor, *args: Any, return_dict: bool = True,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        if self.step_index is None:
            self._init_step_index(timestep)
        index = self.step_index
        wide = backend(sample.device).adjust_dtype(torch.float64)
        denoised = (sample - model_output * self.sigmas[index]).to(wide)
        k, second = divmod(index, 2)
        if k == len(self.steps) - 2:  # the last evaluation, at LAST_SIGMA: its x0
            following = denoised
        elif second:
            following = self._full_step(denoised, k, wide)
        else:
            following = self._midpoint_step(sample.to(self.state_dtype).to(wide), denoised, k, wide)
        self._step_index += 1
        following = following.to(self.state_dtype).to(sample.dtype)
        return FlowMatchEulerDiscreteSchedulerOutput(prev_sample=following) if return_dict else (following,)

    def _midpoint_step(self, anchor: torch.Tensor, denoised: torch.Tensor, k: int, wide: torch.dtype) -> torch.Tensor:
        sigma, sigma_next = self.steps[k].to(wide), self.steps[k + 1].to(wide)
        h = float(-torch.log(self.steps[k + 1].double() / self.steps[k].double()))
        a21, b1, b2 = coefficients(h)
        eps = denoised - anchor
        midpoint = anchor + h * a21 * eps
        sigmas = torch.stack([sigma, torch.sqrt(sigma * sigma_next)]).to(anchor.device)
        midpoint = sde_step(anchor, midpoint, sigmas, noise_like(anchor, self.streams.substep))
        if h < BONG_MAX_H and sigma > BONG_MIN_SIGMA:  # move the anchor to where this midpoint comes from
            for _ in range(BONG_ROUNDS):
                anchor = midpoint - h * a21 * eps
                eps = denoised - anchor
        self._midpoint = _Midpoint(anchor, eps, h, b1, b2)
        return midpoint

    def _full_step(self, denoised: torch.Tensor, k: int, wide: torch.dtype) -> torch.Tensor:
        first, self._midpoint = self._midpoint, None
        if first is None:
            raise RuntimeError("res_2s: a step's second evaluation came without its first")
        following = first.anchor + first.h * (first.b1 * first.eps + first.b2 * (denoised - first.anchor))
        noise = noise_like(first.anchor, self.streams.step)
        return sde_step(first.anchor, following, self.steps[k : k + 2].to(first.anchor.device), noise)


def res2s_scheduler(config: dict[str, Any], state_dtype: torch.dtype) -> Res2sScheduler:
    """A fresh :class:`Res2sScheduler` of a ``FlowMatchEulerDiscreteScheduler`` config."""
    scheduler = Res2sScheduler.from_config(copy.deepcopy(config))
    scheduler.state_dtype = state_dtype
    return scheduler
