"""URSA behind OpenAI's images API: ``POST /v1/images/generations``, served by ``deliverykit.server``.

A request is checked as ``inference.py`` checks its flags (a size the VQ model cannot make is a 400 with the CLI's
message), queued as one job of ``n`` images (seeds ``seed``, ``seed + 1``, ...), run by a worker's :class:`Session`
and answered once done: ``b64_json`` (the default) or ``url`` (``GET /v1/images/{id}/{i}.png``), PNG or, with
``output_format`` ``jpeg``, JPEG. Each image is written as ``inference.py --output <i>/image.png`` (``.jpg``) writes
it, with its ``report.json``; the same seed gives the same image. FastAPI is imported with this module: ``serve.py``
imports it once its flags are checked.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from deliverykit.jobs import Job
from deliverykit.server import Api, ApiError, Service, bad_input, form_value, parse_size, read_body

from . import MODEL_ID
from .generate import ImageRequest, check_request
from .loader import ModelSource

KIND = "img"
MAX_IMAGES = 10  # OpenAI's limit for n
RESPONSE_FORMATS = ("b64_json", "url")
OUTPUT_FORMATS = {"png": ("png", "image/png"), "jpeg": ("jpg", "image/jpeg")}  # OpenAI's output_format → file


def image_path(folder: Path, index: int, output_format: str) -> Path:
    return folder / str(index) / f"image.{OUTPUT_FORMATS[output_format][0]}"


def service(model: ModelSource) -> Service:
    """The images API over ``model`` (checked by ``ModelSource.check``; each device loads its own session)."""

    def load(device_spec: str | None, stack: contextlib.ExitStack) -> Any:
        from .session import Session

        return Session.load(model, stack, device_spec)

    def run(session: Any, job: Job, folder: Path) -> dict[str, Any]:
        from .session import image_outputs

        base = ImageRequest(**job.request["request"])
        stages: dict[str, float] = {}
        for index in range(job.request["n"]):
            request = dataclasses.replace(base, seed=base.seed + index)
            result = session.run(request)
            session.write(result, image_outputs(image_path(folder, index, job.request["output_format"])))
            for stage, ms in result.runs[-1].stages_ms.items():
                stages[stage] = stages.get(stage, 0.0) + ms / 1000.0
        return {"images": job.request["n"], "stages_s": stages}

    def routes(api: Api) -> None:
        @api.app.post("/v1/images/generations")
        async def generations(http: Request) -> JSONResponse:
            fields, _ = await read_body(http)
            request, n, answer, output_format = image_request(model, fields)
            job = api.submit(KIND, {"request": dataclasses.asdict(request), "n": n, "output_format": output_format})
            job = await api.wait(job.id)
            if job.status == "failed":
                raise api.failure(job)
            folder = api.store.folder(job.id)
            if answer == "url":
                base, suffix = str(http.base_url).rstrip("/"), OUTPUT_FORMATS[output_format][0]
                data = [{"url": f"{base}/v1/images/{job.id}/{i}.{suffix}"} for i in range(n)]
            else:
                images = (image_path(folder, i, output_format).read_bytes() for i in range(n))
                data = [{"b64_json": base64.b64encode(image).decode()} for image in images]
            return JSONResponse({"created": int(job.created_at), "data": data, "output_format": output_format})

        @api.app.get("/v1/images/{job_id}/{index}.{suffix}")
        async def image(job_id: str, index: int, suffix: str) -> Any:
            job = api.job(job_id, KIND)
            file_suffix, media_type = OUTPUT_FORMATS[job.request["output_format"]]
            if not 0 <= index < job.request["n"] or suffix != file_suffix:
                raise ApiError(404, f"job {job_id} has {job.request['n']} images, 0.{file_suffix} and on")
            return api.file(job, f"{index}/image.{file_suffix}", media_type)

    return Service(MODEL_ID, (KIND,), load, run, routes)


def image_request(model: ModelSource, fields: dict[str, Any]) -> tuple[ImageRequest, int, str, str]:
    """``(request, n, response_format, output_format)`` of a body, refused (400, the CLI's message) before it is
    queued."""
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(400, "prompt is required: describe the image to make", param="prompt")
    n = form_value(fields, "n", int, 1)
    if not 1 <= n <= MAX_IMAGES:
        raise ApiError(400, f"n {n}: ask for 1 to {MAX_IMAGES} images", param="n")
    response_format = fields.get("response_format") or "b64_json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(400, f"response_format {response_format!r}: use b64_json or url", param="response_format")
    output_format = fields.get("output_format") or "png"
    if output_format not in OUTPUT_FORMATS:
        raise ApiError(400, f"output_format {output_format!r}: use png or jpeg", param="output_format")
    request = model.default_request(prompt)
    size = parse_size(fields.get("size"))
    width, height = size if size else (request.width, request.height)
    request = dataclasses.replace(
        request,
        negative_prompt=str(fields.get("negative_prompt") or ""),
        seed=form_value(fields, "seed", int, request.seed),
        steps=form_value(fields, "steps", int, request.steps),  # steps 0 is refused, not the default
        guidance=form_value(fields, "guidance", float, request.guidance),
        height=height,
        width=width,
    )
    with bad_input():
        check_request(request, model.stride)
    return request, n, response_format, output_format
