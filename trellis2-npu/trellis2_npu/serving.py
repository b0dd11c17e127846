"""TRELLIS.2 image → 3D asset over HTTP, through ``deliverykit.server``: ``/v1/assets`` jobs in the shape of OpenAI's
videos API, and Hunyuan3D-2.1's ``/generate``, ``/send`` and ``/status/{uid}`` for the 3D clients that already call
those.

A request (multipart with the ``image`` file, or ``input_reference`` as OpenAI's video client names it; or JSON with
the image in base64, as Hunyuan3D's clients send it) is checked as ``inference.py`` checks its flags, with the same
messages: the image read now (a decompression bomb or a non-image is a 400), the export options, the pipeline type,
the steps, and an image without alpha refused when no background-removal model was loaded. It is queued as a job with
the upload in its folder and made by a worker's :class:`~trellis2_npu.session.Session` as ``inference.py --output
<job>/asset`` makes it: the same image, seed and options give the same asset. FastAPI and torch are
imported with this module: ``serve.py`` imports it once its flags are checked.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Request

from deliverykit.jobs import Job
from deliverykit.server import (
    Api,
    ApiError,
    JobRoutes,
    Service,
    bad_input,
    base64_bytes,
    form_value,
    read_body,
    read_upload,
)

from . import image, options, tiny
from .geometry.export import ExportOptions
from .loader import MAIN_MODEL
from .session import PREVIEW_VIDEO, Checked, Session, asset_outputs

if TYPE_CHECKING:
    pass

KIND = "asset"
ASSET_FOLDER = "asset"  # a job's outputs, as inference.py --output writes them, apart from its input file
GLB_FILE, GLB_TYPE = f"{ASSET_FOLDER}/asset.glb", "model/gltf-binary"
UPLOAD_FIELDS = ("image", "input_reference")  # the upload's field; its copy in the job's folder has the same name
DEFAULT_SEED = 42  # inference.py's --seed default
FIELDS = {"seed": int, "steps": int, "pipeline_type": str, "faces": int, "texture_size": int, "remesh": bool,
          "remove_background": bool}  # fmt: skip
# upstream's name for the face budget, and Hunyuan3D's names for the face budget and the steps
ALIASES = {"decimation_target": "faces", "face_count": "faces", "num_inference_steps": "steps"}
EXPORT_FIELDS = {"faces": "decimation_target", "texture_size": "texture_size", "remesh": "remesh"}
OPENAI_FIELDS = ("model",)  # sent by OpenAI-style clients; one model is served
# Hunyuan3D-2.1's knobs that TRELLIS.2 has no counterpart for (the asset is always textured): accepted and left
# unused on its routes, so that its clients' bodies pass
HUNYUAN_UNUSED = ("texture", "octree_resolution", "guidance_scale", "num_chunks")
WHOLE_IMAGE = "remove_background=false (--no-rembg)"  # the request field that is --no-rembg
NO_REMBG_LOADED = (
    "the image has no alpha channel and this server runs with --no-rembg (no background-removal model loaded); "
    "send an RGBA image with the object in alpha, or remove_background=false to use the image whole"
)


def service(args: argparse.Namespace, checked: Checked) -> Service:
    """The asset APIs over the model of ``args``, checked by ``serve.py`` (``checked``); each device loads its own
    session. The export flags, ``--pipeline`` and ``--steps`` are the defaults of the requests' fields."""

    def load(device_spec: str | None, stack: contextlib.ExitStack) -> Session:
        from deliverykit.device import resolve_device

        return Session.load(args, stack, resolve_device(device_spec), checked)

    def routes(api: Api) -> None:
        requests = AssetRequests(api.defaults, not args.no_rembg, rembg_refusal(checked))
        variants = {"glb": (GLB_FILE, GLB_TYPE), "preview": (f"{ASSET_FOLDER}/preview.png", "image/png")}
        if args.preview_frames:
            variants["video"] = (f"{ASSET_FOLDER}/{PREVIEW_VIDEO}", "video/mp4")
        JobRoutes("/v1/assets", KIND, requests.accept, describe, variants).add_to(api)
        add_hunyuan_routes(api, requests)

    return Service(MAIN_MODEL, (KIND,), load, run, routes, AssetDefaults.of)


def rembg_refusal(checked: Checked) -> str | None:
    """What a request of an image without alpha that asks for background removal gets when the server has no
    background-removal model (``inference.py``'s message, naming the request field beside ``--no-rembg``)."""
    if checked.rembg_model is not None:
        return None
    if checked.rembg_unavailable is None:
        return NO_REMBG_LOADED
    return checked.rembg_unavailable.replace("--no-rembg", WHOLE_IMAGE)


def run(session: Session, job: Job, folder: Path) -> dict[str, Any]:
    """One job as ``inference.py --output <folder>/asset`` runs one image: its files written together."""
    stored = job.request
    upload = stored["upload"]
    picture = image.load_image(folder / upload) if upload else tiny.tiny_image()
    picture = image.pipeline_input(picture, remove_background=stored["remove_background"])
    request = session.request(
        picture,
        f"{upload} (upload)" if upload else None,
        stored["seed"],
        stored["steps"],
        pipeline_type=stored["pipeline_type"],
        options=ExportOptions(**stored["export"]),
    )
    asset = session.run(request)
    session.write(asset, asset_outputs(folder / ASSET_FOLDER, video=session.preview_frames > 0))
    stages_ms = {**asset.run.stages_ms, **asset.export_ms}
    return {"stages_s": {stage: ms / 1000.0 for stage, ms in stages_ms.items()}}


def describe(job: Job) -> dict[str, Any]:
    """The asset object's own fields: what the job was asked for, the defaults filled in."""
    stored, export = job.request, job.request["export"]
    return {
        "seed": stored["seed"],
        "steps": stored["steps"],
        "pipeline_type": stored["pipeline_type"],
        "faces": export["decimation_target"],
        "texture_size": export["texture_size"],
        "remesh": export["remesh"],
    }


@dataclasses.dataclass(frozen=True)
class AssetDefaults:
    """What a request leaves out, from a loaded session (picklable: ``serve.py --ray`` asks an actor for it)."""

    pipeline_type: str
    export_options: ExportOptions
    default_steps: int | None
    smoke: bool

    @classmethod
    def of(cls, session: Session) -> AssetDefaults:
        return cls(session.pipeline_type, session.export_options, session.default_steps, session.smoke)


@dataclasses.dataclass(frozen=True)
class AssetRequests:
    """What a request leaves out (the loaded session's defaults) and how it is checked before it is queued.

    Args:
        session (`AssetDefaults`): a loaded session's defaults (every device's are the same).
        remove_background (`bool`): the requests' default (not ``--no-rembg``).
        rembg_refusal (`str`, *optional*): the 400 for an image without alpha that asks for background removal
            (None: the server has a background-removal model).
    """

    session: AssetDefaults
    remove_background: bool
    rembg_refusal: str | None

    def accept(
        self, fields: dict[str, Any], files: dict[str, bytes], unused: tuple[str, ...] = ()
    ) -> tuple[dict[str, Any], dict[str, bytes]]:
        """``(stored request, input files)`` of a body, refused (400, ``inference.py``'s message) before it is queued;
        ``unused``: fields accepted and left unused (another API's)."""
        typed = typed_fields({name: value for name, value in fields.items() if name not in unused})
        pipeline_type = typed.get("pipeline_type", self.session.pipeline_type)
        refused = options.unsupported_pipeline(pipeline_type)
        if refused:
            raise ApiError(400, refused, param="pipeline_type", code="invalid_request")
        if "steps" in typed:
            options.check_steps(typed)
        export = dataclasses.replace(
            self.session.export_options, **{EXPORT_FIELDS[name]: typed[name] for name in EXPORT_FIELDS if name in typed}
        )
        export.check()
        upload = find_upload(fields, files)
        if upload is None and not self.session.smoke:
            raise ApiError(400, "image is required: send the image (RGBA with the object in alpha, or RGB) as the "
                           "multipart file image, or in base64 in JSON", param="image")  # fmt: skip
        picture = tiny.tiny_image() if upload is None else read_upload(upload[1], upload[0], image.load_image)
        remove_background = typed.get("remove_background", self.remove_background)
        if remove_background and self.rembg_refusal and not image.has_real_alpha(picture):
            raise ApiError(400, self.rembg_refusal, param="remove_background", code="invalid_request")
        stored = {
            "upload": None if upload is None else upload[0],
            "seed": typed.get("seed", DEFAULT_SEED),
            "steps": typed.get("steps", self.session.default_steps),
            "pipeline_type": pipeline_type,
            "export": dataclasses.asdict(export),
            "remove_background": remove_background,
        }
        return stored, {} if upload is None else {upload[0]: upload[1]}

    def submit_hunyuan(self, api: Api, fields: dict[str, Any], files: dict[str, bytes]) -> Job:
        """A Hunyuan3D-2.1 body checked and queued (its own knobs left unused)."""
        with bad_input():
            stored, inputs = self.accept(fields, files, HUNYUAN_UNUSED)
        return api.submit(KIND, stored, inputs)


def typed_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The body's fields under their names here (an alias under its field's), typed; a 400 names an unknown field or
    one given under two names."""
    typed: dict[str, Any] = {}
    for name in fields:
        if name in UPLOAD_FIELDS or name in OPENAI_FIELDS:
            continue
        field = ALIASES.get(name, name)
        if field not in FIELDS:
            accepted = ", ".join((*UPLOAD_FIELDS, *FIELDS, *ALIASES))
            raise ApiError(400, f"unknown field {name!r}; accepted: {accepted}", param=name)
        if field in typed:
            raise ApiError(400, f"{name}: {field} is given twice, under two names; send one", param=name)
        value = form_value(fields, name, FIELDS[field])
        if value is not None:
            typed[field] = value
    return typed


def find_upload(fields: dict[str, Any], files: dict[str, bytes]) -> tuple[str, bytes] | None:
    """``(field, bytes)`` of the image: a multipart file, or base64 text (a ``data:`` URL too); None without one."""
    for name in UPLOAD_FIELDS:
        if name in files:
            return name, files[name]
        text = fields.get(name)
        if text in (None, ""):
            continue
        if not isinstance(text, str):
            raise ApiError(400, f"{name} must be the image file (multipart) or its bytes in base64 (JSON)", param=name)
        return name, base64_bytes(text, name)
    return None


def add_hunyuan_routes(api: Api, requests: AssetRequests) -> None:
    """Hunyuan3D-2.1's ``api_server.py`` routes over the same jobs: ``POST /generate`` (the GLB once made),
    ``POST /send`` (``{"uid"}``) and ``GET /status/{uid}`` (``processing``, ``completed`` with ``model_base64``, or
    ``error`` with ``message``)."""

    @api.app.post("/generate")
    async def generate(http: Request) -> Any:
        job = await api.wait(requests.submit_hunyuan(api, *await read_body(http)).id)
        if job.status == "failed":
            raise api.failure(job)
        return api.file(job, GLB_FILE, GLB_TYPE)

    @api.app.post("/send")
    async def send(http: Request) -> dict[str, str]:
        return {"uid": requests.submit_hunyuan(api, *await read_body(http)).id}

    @api.app.get("/status/{uid}")
    async def status(uid: str) -> dict[str, str]:
        job = api.job(uid, KIND)
        if job.status == "completed":
            glb = (api.store.folder(job.id) / GLB_FILE).read_bytes()
            return {"status": "completed", "model_base64": base64.b64encode(glb).decode()}
        if job.status == "failed":
            return {"status": "error", "message": job.error["message"]}
        return {"status": "processing"}
