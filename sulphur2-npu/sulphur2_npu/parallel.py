"""Several cards for one video: ``--parallel ulysses=U[,guidance=G]`` and guidance-pass parallel.

A dev-schedule step with full guidance runs the transformer on four sample rows (diffusers 0.42.1
``LTX2Pipeline.__call__``, denoising loop): one call at batch 2 (unconditional, conditional), one STG call and one
modality-isolation call, both on the conditional inputs. With ``guidance=G`` the G rank groups each run a quarter
(G=4) or a half (G=2) of those rows, the rows are all-gathered, and every rank hands the pipeline exactly the tensors
it asked for, so the pipeline's own code combines them (CFG, STG, modality deltas, rescale, scheduler step) on every
rank: the combination is the single-card code, only the transformer outputs come from other ranks.

How, without copying the loop: the transformer's class is swapped for a subclass whose ``__call__`` runs this rank's
rows at the step's first call (the inputs of the STG and modality calls are the conditional row of that call, as the
pipeline builds them), then answers the pipeline's later STG and modality calls from the gathered rows after
checking that their inputs are exactly those it predicted (a pipeline that changed would raise, not drift).
G=2 runs the batch-2 call as it is on group 0 (bit-identical rows) and STG + modality on group 1; G=4 runs every row
at batch 1 (batch 1 vs 2 may round differently: equal within float tolerance).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from deliverykit.errors import DeliveryError, ExitCode
from deliverykit.timing import Stopwatch
from sulphur2_npu.memory import encode_prompt_then_free

ATTENTION_HEADS = 32  # LTX-2.3 video (32 x 128) and audio (32 x 64): Ulysses splits heads, so U divides 32
GUIDANCE_DEGREES = (1, 2, 4)  # the 4 rows of a full-guidance step split evenly
_SPEC_RE = re.compile(r"^(ulysses|guidance)=(\d+)$")
_BATCHED = (
    "hidden_states",
    "audio_hidden_states",
    "encoder_hidden_states",
    "audio_encoder_hidden_states",
    "timestep",
    "audio_timestep",
    "sigma",
    "audio_sigma",
    "encoder_attention_mask",
    "audio_encoder_attention_mask",
    "video_coords",
    "audio_coords",
    "perturbation_mask",
    "video_self_attention_mask",
    "video_keyframes_mask",
)
UNCOND, COND, STG, MODALITY = "uncond", "cond", "stg", "modality"


@dataclasses.dataclass(frozen=True)
class ParallelSpec:
    """Degrees of ``--parallel``: ``ulysses`` (sequence parallel) × ``guidance`` (guidance passes) = world size."""

    ulysses: int = 1
    guidance: int = 1

    @property
    def world_size(self) -> int:
        return self.ulysses * self.guidance

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def parse_parallel(text: str | None, world_size: int) -> ParallelSpec:
    """``ulysses=U[,guidance=G]`` (either order, either optional) checked against ``world_size``; exit 2 if bad.

    ``None`` means one card per job: ``guidance=world_size`` would need the user to say so, so more than one rank
    without ``--parallel`` is an error too (it would run the same video N times).
    """
    if text is None:
        if world_size > 1:
            raise DeliveryError(
                f"{world_size} ranks but no --parallel; pass --parallel guidance={min(world_size, 4)} (or "
                f"ulysses=U,guidance=G with U*G = {world_size})",
                ExitCode.USAGE,
            )
        return ParallelSpec()
    degrees: dict[str, int] = {}
    for part in text.split(","):
        match = _SPEC_RE.match(part.strip().lower())
        if not match or match.group(1) in degrees:
            raise DeliveryError(
                f"--parallel {text!r}: expected ulysses=U[,guidance=G] (e.g. ulysses=4,guidance=2)", ExitCode.USAGE
            )
        degrees[match.group(1)] = int(match.group(2))
    spec = ParallelSpec(**degrees)
    if spec.ulysses < 1 or ATTENTION_HEADS % spec.ulysses:
        raise DeliveryError(
            f"--parallel ulysses={spec.ulysses}: Ulysses splits the {ATTENTION_HEADS} attention heads, so the degree "
            f"must divide {ATTENTION_HEADS}; use 1, 2, 4 or 8",
            ExitCode.USAGE,
        )
    if spec.guidance not in GUIDANCE_DEGREES:
        raise DeliveryError(
            f"--parallel guidance={spec.guidance}: the 4 guidance rows of a step split over 1, 2 or 4 groups; use "
            "one of those",
            ExitCode.USAGE,
        )
    if spec.world_size != world_size:
        raise DeliveryError(
            f"--parallel {text}: ulysses {spec.ulysses} x guidance {spec.guidance} = {spec.world_size} but torchrun "
            f"started {world_size} rank(s); make U*G equal --nproc-per-node x --nnodes",
            ExitCode.USAGE,
        )
    return spec


def check_ulysses_lengths(
    spec: ParallelSpec, width: int, height: int, num_frames: int, text_tokens: int, keyframes: int = 0
) -> None:
    """Exit 2 before loading when U does not divide the video tokens or the text length (both are split evenly).

    Video tokens = (latent frames + ``keyframes``, each appended as one latent frame) × (height / 32) × (width / 32)
    (LTX-2.3's VAE, patch size 1). The audio stream is replicated, so its length is free (``ulysses``).
    """
    if spec.ulysses == 1:
        return
    video = ((num_frames - 1) // 8 + 1 + keyframes) * (height // 32) * (width // 32)
    for what, count, fix in (
        ("video tokens", video, "pick --width/--height/--num-frames whose latent grid it divides"),
        ("text tokens (max_sequence_length)", text_tokens, "keep the default 1024"),
    ):
        if count % spec.ulysses:
            raise DeliveryError(
                f"--parallel ulysses={spec.ulysses} splits the {what} evenly, but there are {count}; {fix}, or "
                f"use a smaller ulysses degree",
                ExitCode.USAGE,
            )


def check_model_heads(spec: ParallelSpec, config: Any) -> None:
    """Ulysses hands each rank heads / U heads of both streams: U must divide the model's head counts."""
    heads = (config.num_attention_heads, config.audio_num_attention_heads)
    if any(count % spec.ulysses for count in heads):
        raise DeliveryError(
            f"--parallel ulysses={spec.ulysses} does not divide this model's attention heads {heads}; use a degree "
            "that does",
            ExitCode.USAGE,
        )


def check_guidance_degree(spec: ParallelSpec, guidance_rows: int) -> None:
    """Exit 2 before loading when the run has fewer guidance rows per step than ``guidance`` groups (distilled: 1)."""
    if spec.guidance > 1 and guidance_rows % spec.guidance:
        raise DeliveryError(
            f"--parallel guidance={spec.guidance} needs a step with {spec.guidance} or 4 guidance passes, this run has "
            f"{guidance_rows} (the distilled schedule and --guidance <= 1 run one pass per step); drop guidance= or "
            "use the dev schedule with guidance > 1",
            ExitCode.USAGE,
        )


def guidance_rows(kwargs: dict[str, Any]) -> tuple[str, ...]:
    """The sample rows one step runs, in the pipeline's order, from its guidance arguments (its ``do_*`` rules)."""
    rows = [UNCOND, COND] if kwargs["guidance_scale"] > 1.0 or kwargs["audio_guidance_scale"] > 1.0 else [COND]
    if kwargs["stg_scale"] > 0.0 or kwargs["audio_stg_scale"] > 0.0:
        rows.append(STG)
    if kwargs["modality_scale"] > 1.0 or kwargs["audio_modality_scale"] > 1.0:
        rows.append(MODALITY)
    return tuple(rows)


def guidance_groups(spec: ParallelSpec, rank: int) -> tuple[int, list[list[int]]]:
    """This rank's guidance index and every guidance group (ranks with the same Ulysses index; Ulysses = neighbours)."""
    groups = [[u + spec.ulysses * g for g in range(spec.guidance)] for u in range(spec.ulysses)]
    return rank // spec.ulysses, groups


@dataclasses.dataclass
class _Pending:
    kwargs: dict[str, Any]
    outputs: tuple[torch.Tensor, torch.Tensor]


class GuidanceParallel:
    """State of one installed guidance-pass split (see the module docstring). ``bytes_received`` counts gathers."""

    def __init__(self, rows: Sequence[str], index: int, degree: int, group: Any, stg_blocks: list[int] | None):
        if len(rows) % degree:
            raise ValueError(f"{len(rows)} guidance rows do not split over {degree} groups")
        self.rows = tuple(rows)
        self.index, self.degree, self.group = index, degree, group
        self.stg_blocks = stg_blocks
        self.pending: dict[str, _Pending] = {}
        self.bytes_received = 0

    def mine(self) -> tuple[str, ...]:
        share = len(self.rows) // self.degree
        return self.rows[self.index * share : (self.index + 1) * share]


def _slice(kwargs: dict[str, Any], rows: slice, batch: int) -> dict[str, Any]:
    out = dict(kwargs)
    for name in _BATCHED:
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == batch:
            out[name] = value[rows]
        elif isinstance(value, torch.Tensor) and value.ndim and value.shape[0] != 1:
            raise ValueError(f"{name} has batch {value.shape[0]}, the call has {batch}")
    unknown = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k not in _BATCHED]
    if unknown:
        raise TypeError(f"unknown tensor arguments {unknown} of the LTX-2 transformer: update sulphur2_npu.parallel")
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


def _pass_of(kwargs: dict[str, Any]) -> str:
    if kwargs.get("isolate_modalities"):
        return MODALITY
    if kwargs.get("spatio_temporal_guidance_blocks"):
        return STG
    return COND


def _parallel_call(state: GuidanceParallel, call: Any, kwargs: dict[str, Any]) -> Any:
    import torch.distributed as dist

    if kwargs.get("return_dict", True):
        raise TypeError("the guidance-parallel transformer needs return_dict=False (as the LTX-2 pipelines call it)")
    kind = _pass_of(kwargs)
    if kind != COND:  # the STG or modality call of this step: computed at the step's first call
        pending = state.pending.pop(kind, None)
        if pending is None or set(pending.kwargs) != set(kwargs):
            raise RuntimeError(f"unexpected {kind} transformer call: the pipeline's pass order changed")
        for name, value in kwargs.items():
            if not _same(value, pending.kwargs[name]):
                raise RuntimeError(f"the {kind} call's {name} differs from the conditional row's: pipeline changed")
        return pending.outputs
    if state.pending:
        raise RuntimeError(f"guidance passes {sorted(state.pending)} were never asked for: the pipeline changed")
    batch = kwargs["hidden_states"].shape[0]
    main_rows = [row for row in state.rows if row in (UNCOND, COND)]
    if batch != len(main_rows):
        raise RuntimeError(f"first transformer call of a step has batch {batch}, expected {len(main_rows)}")
    cond = _slice(kwargs, slice(batch - 1, batch), batch)  # the pipeline's STG/modality inputs: the conditional row
    extra = {
        STG: {**cond, "spatio_temporal_guidance_blocks": state.stg_blocks},
        MODALITY: {**cond, "isolate_modalities": True},
    }
    mine = state.mine()
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
    mine_main = [row for row in mine if row in main_rows]
    if mine_main:
        first = main_rows.index(mine_main[0])
        rows = slice(first, first + len(mine_main))
        video, audio = call(**(kwargs if len(mine_main) == batch else _slice(kwargs, rows, batch)))
        outputs += [(video[i : i + 1], audio[i : i + 1]) for i in range(len(mine_main))]
    for row in mine:
        if row in extra:
            outputs.append(call(**extra[row]))
    video_mine = torch.cat([v for v, _ in outputs]).contiguous()
    audio_mine = torch.cat([a for _, a in outputs]).contiguous()
    videos = [torch.empty_like(video_mine) for _ in range(state.degree)]
    audios = [torch.empty_like(audio_mine) for _ in range(state.degree)]
    dist.all_gather(videos, video_mine, group=state.group)
    dist.all_gather(audios, audio_mine, group=state.group)
    state.bytes_received += (state.degree - 1) * (video_mine.nbytes + audio_mine.nbytes)
    video_rows, audio_rows = torch.cat(videos), torch.cat(audios)
    by_row = {row: (video_rows[i : i + 1], audio_rows[i : i + 1]) for i, row in enumerate(state.rows)}
    for row in extra:
        if row in by_row:
            state.pending[row] = _Pending(extra[row], by_row[row])
    n = len(main_rows)
    return video_rows[:n], audio_rows[:n]


def install_guidance_parallel(transformer: torch.nn.Module, state: GuidanceParallel) -> None:
    """Swap ``transformer``'s class for one whose calls go through ``state`` (hooks and parameters untouched)."""
    base = type(transformer)
    if getattr(base, "_sulphur_guidance_parallel", False):
        raise RuntimeError("guidance parallel is already installed on this transformer")

    def __call__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError("call the guidance-parallel LTX-2 transformer with keyword arguments")
        return _parallel_call(self._sulphur_guidance_state, super(swapped, self).__call__, kwargs)

    swapped = type(f"GuidanceParallel{base.__name__}", (base,), {"__call__": __call__})
    swapped._sulphur_guidance_parallel = True
    transformer._sulphur_guidance_state = state
    transformer.__class__ = swapped


def uninstall_guidance_parallel(transformer: torch.nn.Module) -> None:
    """Undo :func:`install_guidance_parallel` (a no-op when it is not installed)."""
    if getattr(type(transformer), "_sulphur_guidance_parallel", False):
        transformer.__class__ = type(transformer).__mro__[1]
        del transformer._sulphur_guidance_state


@dataclasses.dataclass(frozen=True)
class ParallelRun:
    """This rank's part of a multi-card run: the degrees, its guidance index and the process group of its G peers."""

    spec: ParallelSpec
    rank: int
    guidance_index: int
    guidance_group: Any  # a torch.distributed group, or None for the whole world


def setup_parallel(
    spec: ParallelSpec,
    rank: int,
    *,
    transformer: torch.nn.Module | None = None,
    device: torch.device | None = None,
    vae: torch.nn.Module | None = None,
) -> ParallelRun | None:
    """The groups of ``spec`` (every rank calls this, in the same order), Ulysses installed on ``transformer``, the
    tiles of ``vae``'s tiled decode split over all ranks (``split_decode``; when a memory plan turns tiling on).

    One device mesh (guidance, ring = 1, ulysses): a Ulysses group is U neighbouring ranks (one server's cards), a
    guidance group the ranks with the same Ulysses index. None for one card.
    """
    if spec.world_size == 1:
        return None
    if vae is not None:
        from sulphur2_npu.split_decode import split_tiled_decode

        split_tiled_decode(vae, rank=rank, world_size=spec.world_size, device=device or torch.device("cpu"))
    index, _ = guidance_groups(spec, rank)
    if spec.ulysses == 1:
        return ParallelRun(spec, rank, index, None)
    from torch.distributed.device_mesh import init_device_mesh

    from sulphur2_npu.ulysses import enable_ulysses

    if transformer is None or device is None:
        raise ValueError("Ulysses needs the transformer and the rank's device")
    check_model_heads(spec, transformer.config)
    mesh = init_device_mesh(
        device.type, (spec.guidance, 1, spec.ulysses), mesh_dim_names=("guidance", "ring", "ulysses")
    )
    enable_ulysses(transformer, degree=spec.ulysses, device=device, mesh=mesh)
    return ParallelRun(spec, rank, index, mesh["guidance"].get_group() if spec.guidance > 1 else None)


@contextlib.contextmanager
def guidance_parallel(pipe: Any, kwargs: dict[str, Any], run: ParallelRun | None) -> Iterator[GuidanceParallel | None]:
    """Split the guidance passes of every step of one ``pipe(**kwargs)`` call over ``run``'s guidance group."""
    if run is None or run.spec.guidance == 1:
        yield None
        return
    rows = guidance_rows(kwargs)
    check_guidance_degree(run.spec, len(rows))
    state = GuidanceParallel(
        rows, run.guidance_index, run.spec.guidance, run.guidance_group, kwargs["spatio_temporal_guidance_blocks"]
    )
    install_guidance_parallel(pipe.transformer, state)
    try:
        yield state
    finally:
        uninstall_guidance_parallel(pipe.transformer)


def encode_prompt_ahead(pipe: Any, request: Any, context: Any, *, free_text_encoder: bool) -> tuple[Any, float | None]:
    """``(request, encode ms)``: the prompt encoded before the pipeline call when the run needs it, else as it was.

    ``context`` is this process's ``deliverykit.distributed.DistributedContext`` (its device, rank and world size).

    Several ranks: Gemma runs on rank 0 and its embeddings are broadcast (:func:`encode_once_and_broadcast`); a
    memory plan that frees the text encoder: Gemma runs once, then leaves the device (``memory``). The request then
    carries ``prompt_embeds``; otherwise the pipeline encodes the prompt itself (encode ms None).
    """
    if not (context.distributed or free_text_encoder):
        return request, None
    clock = Stopwatch(context.device)  # synchronized: the embeddings are on the device when it stops
    with clock.stage("encode_prompt"):
        if context.distributed:
            embeds = encode_once_and_broadcast(pipe, request, device=context.device, rank=context.rank)
        else:
            embeds = encode_prompt_then_free(pipe, device=context.device, **request.encode_kwargs())
    return dataclasses.replace(request, prompt_embeds=embeds), clock.stages["encode_prompt"]


def encode_once_and_broadcast(pipe: Any, request: Any, *, device: torch.device, rank: int) -> dict[str, torch.Tensor]:
    """Gemma-3 runs on rank 0 only (``memory.encode_prompt_then_free``); every rank gets its embeddings.

    The other ranks have no text encoder (``load_pipeline(load_text_encoder=False)``) or drop it unused. Shapes go
    first as a small object, then each tensor is broadcast on the rank's device (hccl/nccl need device tensors).
    """
    import torch.distributed as dist

    if rank == 0:
        embeds = encode_prompt_then_free(pipe, device=device, **request.encode_kwargs())
        layout = [{name: (tuple(t.shape), t.dtype) for name, t in embeds.items()}]
    else:
        pipe.register_modules(text_encoder=None)
        layout = [None]
    dist.broadcast_object_list(layout, src=0, device=device if device.type != "cpu" else None)
    out = {}
    for name, (shape, dtype) in layout[0].items():
        tensor = embeds[name].to(device).contiguous() if rank == 0 else torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(tensor, src=0)
        out[name] = tensor
    return out
