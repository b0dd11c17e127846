"""The full TRELLIS.2 image → mesh pipeline, run through the patched upstream code.

The upstream checkout (microsoft/TRELLIS.2 at the commit pinned in ``patches/upstream.json``, with this delivery's
patches applied) is found by :func:`find_upstream`, checked by :func:`check_upstream`, and put on ``sys.path``;
:func:`load_pipeline` builds ``Trellis2ImageTo3DPipeline`` with upstream's loader (patched to load strictly), and
:func:`run_pipeline` calls its ``run()`` with per-stage timings (:class:`deliverykit.timing.Stopwatch`) and token
counts. Nothing here does model maths: that is upstream's code and this package's hooks (:mod:`.upstream_hooks`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from deliverykit.errors import DeliveryError, ExitCode, WeightsError

from . import upstream_hooks

DELIVERY_DIR = Path(__file__).resolve().parent.parent
ENV_VAR = "TRELLIS2_SRC"
MARKER = "trellis2/__init__.py"
PIPELINE_TYPES = ("512", "1024", "1024_cascade", "1536_cascade")
SAMPLERS = ("sparse_structure", "shape_slat", "tex_slat")
MANIFEST = DELIVERY_DIR / "weights-manifest.json"
MAIN_MODEL = "microsoft/TRELLIS.2-4B"
AUXILIARY_MODELS = ("microsoft/TRELLIS-image-large", "facebook/dinov3-vitl16-pretrain-lvd1689m")
REMBG_MODEL = "briaai/RMBG-2.0"


class UpstreamError(DeliveryError):
    """No upstream checkout, one at another commit, or one without the patches (exit code 3, like ``patches``)."""

    exit_code = ExitCode.INPUT


def _clone_hint(target: str = "DIR") -> str:
    return (
        f"python -m deliverykit upstream clone --delivery {DELIVERY_DIR.name} --into {target} && "
        f"python -m deliverykit patches apply --delivery {DELIVERY_DIR.name} --upstream {target}"
    )


def find_upstream(upstream: str | os.PathLike | None = None) -> Path:
    """The upstream tree: ``upstream``, else ``$TRELLIS2_SRC``, else the folder holding an installed ``trellis2``."""
    source = "--upstream"
    if upstream is None and os.environ.get(ENV_VAR):
        upstream, source = os.environ[ENV_VAR], f"${ENV_VAR}"
    if upstream is None:
        spec = importlib.util.find_spec("trellis2")
        if spec is None or not spec.submodule_search_locations:
            raise UpstreamError(
                f"no TRELLIS.2 source found (no --upstream, no ${ENV_VAR}, no installed trellis2); get it with: "
                f"{_clone_hint()}, then pass --upstream DIR"
            )
        return Path(next(iter(spec.submodule_search_locations))).parent
    path = Path(upstream)
    if not (path / MARKER).is_file():
        raise UpstreamError(
            f"{source} {path} is not a TRELLIS.2 checkout ({MARKER} missing); get one with: {_clone_hint(str(path))}"
        )
    return path


def check_upstream(path: str | os.PathLike) -> None:
    """Fail, naming the fixing command, unless ``path`` is the pinned commit with every patch applied."""
    from deliverykit.assets.patches import PatchError, require_patched

    try:
        require_patched(DELIVERY_DIR, path)
    except PatchError as error:
        raise UpstreamError(str(error)) from None


def import_upstream(path: str | os.PathLike):
    """Put ``path`` first on ``sys.path`` and return the patched ``Trellis2ImageTo3DPipeline`` class."""
    path = str(Path(path).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)
    from trellis2.pipelines import Trellis2ImageTo3DPipeline

    return Trellis2ImageTo3DPipeline


def main_folder(weights_dir: str | os.PathLike) -> Path:
    """The ``TRELLIS.2-4B`` folder (with ``pipeline.json``): ``weights_dir`` itself or its ``TRELLIS.2-4B``."""
    folder = Path(weights_dir)
    if not (folder / "pipeline.json").is_file() and (folder / "TRELLIS.2-4B" / "pipeline.json").is_file():
        folder = folder / "TRELLIS.2-4B"
    if not (folder / "pipeline.json").is_file():
        raise WeightsError(
            f"{weights_dir} has no pipeline.json; download the weights with: deliverykit weights download "
            f"--manifest {DELIVERY_DIR.name}/weights-manifest.json --root ROOT, then pass --weights ROOT/TRELLIS.2-4B"
        )
    return folder


def check_weights(weights_dir: str | os.PathLike, *, rembg: bool, strict: bool = False) -> list[Any]:
    """The manifest check (:mod:`deliverykit.assets.loadcheck`) of every model the run loads, before loading any.

    The main folder always; the auxiliary models (and RMBG-2.0 when ``rembg``: an image without alpha) where the
    download puts them, ``<root>/<local_dir>``. One found elsewhere is left to the loader's own checks.
    """
    from deliverykit.assets.loadcheck import check_models_for_loading
    from deliverykit.assets.manifest import load_manifest

    folder = main_folder(weights_dir)
    wanted = (*AUXILIARY_MODELS, *((REMBG_MODEL,) if rembg else ()))
    models = [(folder, MAIN_MODEL)] + [
        (folder.parent / model.local_dir, model.id)
        for model in load_manifest(MANIFEST, validate=False).models
        if model.id in wanted and (folder.parent / model.local_dir).is_dir()
    ]
    return check_models_for_loading(MANIFEST, models, strict=strict)


def load_pipeline(weights_dir: str | os.PathLike, device: torch.device, pipeline_class) -> Any:
    """Upstream's ``from_pretrained`` on a local folder, strictly, then moved to ``device``.

    ``weights_dir`` is the ``TRELLIS.2-4B`` folder (with ``pipeline.json``) or the root above it; models referenced
    by hub id (``microsoft/TRELLIS-image-large/...``, DINOv3, RMBG) are looked up next to it (``<root>/<repo>``).
    """
    folder = main_folder(weights_dir)
    upstream_hooks.set_model_roots([folder.parent])
    import json

    references = json.loads((folder / "pipeline.json").read_text(encoding="utf-8"))["args"]["models"]
    absent = [ref for ref in references.values() if upstream_hooks.resolve_model_path(ref, base=folder) is None]
    if absent:
        raise WeightsError(
            f"{folder}: checkpoints not found: {', '.join(absent)} (looked in {folder} and {folder.parent})"
        )
    pipeline = pipeline_class.from_pretrained(str(folder))
    pipeline.to(device)
    return pipeline


@dataclasses.dataclass
class PipelineResult:
    mesh: Any  # upstream MeshWithVoxel
    pipeline_type: str
    resolution: int
    stages_ms: dict[str, float]
    tokens: dict[str, int]
    total_ms: float


def _wrap(obj: Any, name: str, wrapper: Callable[[Callable], Callable]) -> None:
    """Shadow ``obj.name`` by ``wrapper(original)`` on this instance only (removed by :func:`_unwrap`)."""
    setattr(obj, name, wrapper(getattr(obj, name)))


def run_pipeline(
    pipeline: Any,
    image: Image.Image,
    pipeline_type: str,
    seed: int,
    steps: int | None,
    device: torch.device,
    preprocess: bool = True,
) -> PipelineResult:
    """``pipeline.run(image, pipeline_type=..., seed=...)`` with stage timings and token counts.

    Stages (exclusive, milliseconds): ``conditioning_<px>``, ``flow:<model key>`` (one per flow model run),
    ``decoder:<model key>`` (``.upsample`` for the cascade's coordinate upsampling) and ``mesh_extraction``
    (taken out of the shape decoder's time). Tokens: the flow input sizes (dense 16³ for the sparse structure),
    then ``voxels`` (decoded voxels carrying PBR attributes).
    """
    from deliverykit.timing import Stopwatch

    if pipeline_type not in PIPELINE_TYPES:
        raise DeliveryError(
            f"--pipeline {pipeline_type!r} is not supported; pick one of {', '.join(PIPELINE_TYPES)}", ExitCode.USAGE
        )
    watch = Stopwatch(device)
    tokens: dict[str, int] = {}
    names = {id(model): key for key, model in pipeline.models.items()}

    def sampler_wrapper(original):
        def sample(model, noise, *args, **kwargs):
            key = names.get(id(model), type(model).__name__)
            feats = getattr(noise, "feats", None)
            tokens[key] = int(feats.shape[0]) if feats is not None else int(noise[0, 0].numel())
            with watch.stage(f"flow:{key}"):
                return original(model, noise, *args, **kwargs)

        return sample

    def cond_wrapper(original):
        def get_cond(image, resolution, *args, **kwargs):
            with watch.stage(f"conditioning_{resolution}"):
                return original(image, resolution, *args, **kwargs)

        return get_cond

    def stage_wrapper(stage):
        def wrapper(original):
            def call(*args, **kwargs):
                with watch.stage(stage):
                    return original(*args, **kwargs)

            return call

        return wrapper

    wrapped: list[tuple[Any, str]] = []
    for sampler in {
        id(getattr(pipeline, f"{s}_sampler")): getattr(pipeline, f"{s}_sampler") for s in SAMPLERS
    }.values():
        _wrap(sampler, "sample", sampler_wrapper)
        wrapped.append((sampler, "sample"))
    _wrap(pipeline, "get_cond", cond_wrapper)
    wrapped.append((pipeline, "get_cond"))
    for key in ("sparse_structure_decoder", "shape_slat_decoder", "tex_slat_decoder"):
        _wrap(pipeline.models[key], "forward", stage_wrapper(f"decoder:{key}"))
        wrapped.append((pipeline.models[key], "forward"))
    _wrap(pipeline.models["shape_slat_decoder"], "upsample", stage_wrapper("decoder:shape_slat_decoder.upsample"))
    wrapped.append((pipeline.models["shape_slat_decoder"], "upsample"))

    params = {"steps": steps} if steps is not None else {}
    upstream_hooks.set_stage_timer(watch.stage)
    try:
        meshes, (_, _, resolution) = pipeline.run(
            image,
            seed=seed,
            pipeline_type=pipeline_type,
            preprocess_image=preprocess,
            sparse_structure_sampler_params=params,
            shape_slat_sampler_params=params,
            tex_slat_sampler_params=params,
            return_latent=True,
        )
    finally:
        upstream_hooks.set_stage_timer(None)
        for obj, name in wrapped:
            delattr(obj, name)
    mesh = meshes[0]
    tokens["voxels"] = int(mesh.attrs.shape[0])
    stages = watch.stages
    if "mesh_extraction" in stages and "decoder:shape_slat_decoder" in stages:
        stages["decoder:shape_slat_decoder"] -= stages["mesh_extraction"]
    return PipelineResult(mesh, pipeline_type, int(resolution), stages, tokens, sum(stages.values()))
