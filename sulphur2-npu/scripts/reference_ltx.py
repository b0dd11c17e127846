#!/usr/bin/env python3
"""The delivery and stock diffusers 0.42.1 against ltx-core / ltx-pipelines at 400fd310 (the README's before/after).

Same tiny LTX-2.3 single file (``tiny.write_smoke_files``, seed 0; its transformer built, initialised and saved by
ltx-core itself) for both sides, same inputs, fp32 on the CPU (``sulphur2_npu.ltx_peer``; random weights). Figure:
max |delivery - reference| / max |reference|. "Stock" is the same weights in diffusers' classes as they are:
``perturbed_attn`` at its default False, ``LTX2ImageToVideoPipeline``, no cross-attention hook, the vocoder in the
pipeline dtype, and for a file without ``vae`` metadata the zero decoder padding the loader assumed before. Needs
``LTX2_SRC`` (a Lightricks/LTX-2 checkout at 400fd310). With torchaudio importable (PyPI has none for torch 2.13: a
torchaudio 2.11 wheel unpacked on ``PYTHONPATH``, its compiled libraries left out, runs its pure-Python resample and
mel), ltx-core's own front end encodes the a2v and retake test tone; otherwise the delivery's mel feeds ltx-core's
encoder.

    LTX2_SRC=/path/to/LTX-2 python sulphur2-npu/scripts/reference_ltx.py \
        --output sulphur2-npu/results/reference_ltx.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from deliverykit.errors import InputError, run_main

DEV_STEPS = 4
TWO_STAGE_RUNS = ("distilled", "two-stage", "distilled, image", "two-stage-hq", "two-stage-hq, image")
COMMAND = "LTX2_SRC=... python sulphur2-npu/scripts/reference_ltx.py --output sulphur2-npu/results/reference_ltx.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="results JSON for the README")
    return parser.parse_args(argv)


def _variant(pipe, *, stg: bool, cross_timestep: bool, x0: bool):
    """``pipe``'s weights with each of the three fixes on or off (all off = stock diffusers)."""
    from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline, LTX2VideoTransformer3DModel

    from sulphur2_npu.reference_fixes import ReferenceImageToVideoPipeline, install_cross_timestep_fix

    transformer = LTX2VideoTransformer3DModel.from_config({**pipe.transformer.config, "perturbed_attn": stg})
    transformer.load_state_dict(pipe.transformer.state_dict())
    transformer.eval()
    if cross_timestep:
        install_cross_timestep_fix(transformer)
    image_to_video = isinstance(pipe, LTX2ImageToVideoPipeline)
    cls = (ReferenceImageToVideoPipeline if x0 else LTX2ImageToVideoPipeline) if image_to_video else LTX2Pipeline
    variant = cls(**{**pipe.components, "transformer": transformer})
    variant.set_progress_bar_config(disable=True)
    return variant


def _pair(reference, got) -> float:
    from sulphur2_npu.ltx_peer import relative_error

    return max(relative_error(ours, theirs) for ours, theirs in zip(got, reference, strict=True))


def measure_loops(smoke, image) -> dict[str, dict[str, float]]:
    """Forward and loop errors (worst of video/audio) of each variant; a loop against ltx-pipelines' loop from that
    variant's own first transformer inputs (stock diffusers draws its noise in another order: ``measure_noise``)."""
    import torch

    from sulphur2_npu import ltx_peer
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.schedules import DISTILLED, DISTILLED_STEPS

    model = ltx_peer.transformer(smoke.checkpoint)
    variants = {
        "stock": {"stg": False, "cross_timestep": False, "x0": False},
        "+STG": {"stg": True, "cross_timestep": False, "x0": False},
        "+STG+cross": {"stg": True, "cross_timestep": True, "x0": False},
        "delivery": {"stg": True, "cross_timestep": True, "x0": True},
    }
    dev = dataclasses.replace(tiny_request(), steps=DEV_STEPS)
    distilled = dataclasses.replace(tiny_request(), steps=DISTILLED_STEPS, guidance=1.0, schedule=DISTILLED)
    checks = {
        "forward_t2v": (False, tiny_request(), "forward"),
        "forward_i2v": (True, tiny_request(), "forward"),
        "dev_t2v": (False, dev, "loop"),
        "dev_i2v": (True, dev, "loop"),
        "distilled_t2v": (False, distilled, "loop"),
    }
    results: dict[str, dict[str, float]] = {}
    for name, (image_to_video, request, kind) in checks.items():
        loaded = load_pipeline(
            smoke.checkpoint, smoke.text_encoder, image_to_video=image_to_video, torch_dtype=torch.float32
        ).pipe
        conditioning = image if image_to_video else None
        first = ltx_peer.first_call(loaded, request, conditioning)
        if kind == "forward":
            with torch.no_grad():
                reference = model(*ltx_peer.modalities(first), None)
        results[name] = {}
        for label, switches in variants.items():
            pipe = loaded if label == "delivery" else _variant(loaded, **switches)
            if kind == "forward":
                with torch.no_grad():
                    got = pipe.transformer(**{**first, "return_dict": False})
            else:
                video, audio, sigmas = ltx_peer.delivery_final_latents(pipe, request, conditioning)
                got = (video, audio)
                reference = ltx_peer.pipelines_loop(
                    model, ltx_peer.first_call(pipe, request, conditioning), sigmas, request
                )
            results[name][label] = _pair(reference, got)
            print(f"{name} {label}: {results[name][label]:.2e}")
    return results


def measure_vae_defaults(smoke_files, partial, folder: Path) -> dict[str, float]:
    """A file without ``vae`` metadata: decode vs ltx-core's decoder for that section's absent-field defaults."""
    import torch
    from diffusers import AutoencoderKLLTX2Video
    from safetensors import safe_open
    from safetensors.torch import save_file

    from sulphur2_npu import ltx_peer
    from sulphur2_npu.loader import load_pipeline

    with safe_open(str(smoke_files.checkpoint), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a Mapping
        config = json.loads(handle.metadata()["config"])
    config["vae"] = {k: v for k, v in config["vae"].items() if k not in ("spatial_padding_mode", "causal_decoder")}
    reference_file = folder / "vae-defaults.safetensors"
    save_file(tensors, str(reference_file), metadata={"config": json.dumps(config)})
    decoder = ltx_peer.video_decoder(reference_file)
    pipe = load_pipeline(partial.checkpoint, partial.text_encoder, torch_dtype=torch.float32).pipe
    old = AutoencoderKLLTX2Video.from_config(
        {**pipe.vae.config, "decoder_spatial_padding_mode": "zeros", "encoder_spatial_padding_mode": "zeros"}
    )
    old.load_state_dict(pipe.vae.state_dict())
    latent = torch.randn(1, pipe.vae.config.latent_channels, 2, 2, 3, generator=torch.Generator().manual_seed(0))
    vae = pipe.vae
    with torch.no_grad():
        reference = decoder(latent)
        denormalized = pipe._denormalize_latents(latent, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
        figures = {
            label: ltx_peer.relative_error(module.eval().decode(denormalized, None, return_dict=False)[0], reference)
            for label, module in (("stock", old), ("delivery", vae))
        }
    print(f"vae decode without metadata: {figures}")
    return figures


def measure_vocoder(smoke) -> dict[str, float]:
    """The vocoder at bf16 (the pipeline dtype before) and float32 (now) vs ltx-core's float32 BWE vocoder."""
    import copy

    import torch

    from sulphur2_npu import ltx_peer
    from sulphur2_npu.loader import load_pipeline

    pipe = load_pipeline(smoke.checkpoint, smoke.text_encoder, torch_dtype=torch.float32).pipe
    reference_vocoder = ltx_peer.vocoder(smoke.checkpoint, pipe.vocoder.config.in_channels)
    mel_shape = (1, 2, 24, pipe.vocoder.config.num_mel_channels)
    # a bf16 pipeline hands the vocoder a bf16 mel: every side gets that same rounded input
    mel = torch.randn(mel_shape, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    bf16 = copy.deepcopy(pipe.vocoder)
    bf16._forward_pre_hooks.clear()
    bf16.to(torch.bfloat16)
    with torch.no_grad():
        reference = reference_vocoder(mel.float())
        figures = {
            "stock": ltx_peer.relative_error(bf16(mel), reference),
            "delivery": ltx_peer.relative_error(pipe.vocoder(mel), reference),
        }
    print(f"vocoder, bf16 pipeline: {figures}")
    return figures


def measure_two_stage(ltx_written: Path, smoke, image) -> dict[str, dict[str, float]]:
    """Each hand-over of the two-stage pipelines (``ltx_peer.two_stage_errors``; the distilled and HQ ones also with a
    first frame) and the upsampler's one forward."""
    import torch

    from sulphur2_npu import ltx_peer, upsampler
    from sulphur2_npu.loader import load_pipeline

    model = ltx_peer.transformer(ltx_written)
    results = {}
    for name, pipeline, first_frame in (
        ("distilled", "distilled", None), ("two-stage", "two-stage", None), ("distilled, image", "distilled", image),
        ("two-stage-hq", "two-stage-hq", None), ("two-stage-hq, image", "two-stage-hq", image),
    ):  # fmt: skip
        pipe = load_pipeline(
            ltx_written, smoke.text_encoder, torch_dtype=torch.float32, image_to_video=first_frame is not None
        ).pipe
        results[name] = ltx_peer.two_stage_errors(
            pipe, model, ltx_written, smoke, pipeline, steps=DEV_STEPS, image=first_frame
        )
        print(f"{name}: {results[name]}")
    pipe = load_pipeline(ltx_written, smoke.text_encoder, torch_dtype=torch.float32).pipe
    ours, _ = upsampler.load_upsampler(smoke.upsampler, latent_channels=8, torch_dtype=torch.float32)
    normalised = torch.randn((1, 8, 2, 2, 3), generator=torch.Generator().manual_seed(0))
    vae = pipe.vae
    raw = pipe._denormalize_latents(normalised, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    got = pipe._normalize_latents(upsampler.upsample(ours, raw), vae.latents_mean, vae.latents_std)
    reference = ltx_peer.upsample_tokens(
        normalised.flatten(2).transpose(1, 2),
        tuple(normalised.shape),
        ltx_peer.video_encoder(ltx_written),
        ltx_peer.latent_upsampler(smoke.upsampler),
    )
    results["upsampler"] = {"forward": ltx_peer.relative_error(got.flatten(2).transpose(1, 2), reference)}
    return results


def measure_keyframes(ltx_written: Path, smoke, folder: Path) -> dict[str, dict[str, float]]:
    """``ltx_peer.keyframe_errors`` for the delivery, and with diffusers' own velocity → x0 (one σ for every token)
    in place of the delivery's per-token σ."""
    import torch
    from diffusers import LTX2ConditionPipeline

    from sulphur2_npu import ltx_peer
    from sulphur2_npu.keyframes import KeyframePipeline
    from sulphur2_npu.loader import load_pipeline

    model = ltx_peer.transformer(ltx_written)
    results = {}
    own = KeyframePipeline.convert_velocity_to_x0
    for name, convert in (("delivery", own), ("stock", LTX2ConditionPipeline.convert_velocity_to_x0)):
        KeyframePipeline.convert_velocity_to_x0 = convert
        try:
            pipe = load_pipeline(ltx_written, smoke.text_encoder, torch_dtype=torch.float32).pipe
            results[name] = ltx_peer.keyframe_errors(pipe, model, ltx_written, smoke, folder, steps=DEV_STEPS)
        finally:
            KeyframePipeline.convert_velocity_to_x0 = own
        print(f"keyframes, {name}: {results[name]}")
    return results


def measure_a2v(ltx_written: Path, smoke, image) -> dict[str, dict[str, float | str]]:
    """``ltx_peer.a2v_errors`` for the delivery, without and with a first frame: each hand-over, and which mel front
    end the reference used."""
    import torch

    from sulphur2_npu import ltx_peer
    from sulphur2_npu.loader import load_pipeline

    model, results = ltx_peer.transformer(ltx_written), {}
    for name, first_frame in (("sound", None), ("sound + image", image)):
        pipe = load_pipeline(
            ltx_written, smoke.text_encoder, torch_dtype=torch.float32, image_to_video=first_frame is not None
        ).pipe
        results[name] = ltx_peer.a2v_errors(pipe, model, ltx_written, smoke, steps=DEV_STEPS, image=first_frame)
        print(f"a2v, {name}: {results[name]}")
    return results


def measure_noise(ltx_written: Path, smoke, image) -> dict[str, dict[str, float]]:
    """``ltx_peer.initial_noise_errors`` of the delivery's pipelines and of diffusers' as they are (the same modules),
    text and image to video: where the seed's noise lands."""
    import torch
    from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline

    from sulphur2_npu import ltx_peer
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.loader import load_pipeline

    results = {}
    for mode, first_frame, stock_class in (("t2v", None, LTX2Pipeline), ("i2v", image, LTX2ImageToVideoPipeline)):
        pipe = load_pipeline(
            ltx_written, smoke.text_encoder, torch_dtype=torch.float32, image_to_video=first_frame is not None
        ).pipe
        stock = stock_class(**pipe.components)
        stock.set_progress_bar_config(disable=True)
        for name, variant in (("delivery", pipe), ("stock", stock)):
            results[f"{mode}, {name}"] = ltx_peer.initial_noise_errors(variant, tiny_request(), first_frame)
            print(f"initial noise, {mode}, {name}: {results[f'{mode}, {name}']}")
    return results


def measure_retake(ltx_written: Path, smoke, folder: Path) -> dict[str, dict[str, float | str]]:
    """``ltx_peer.retake_errors`` for a source with sound and a silent one."""
    import torch

    from sulphur2_npu import ltx_peer
    from sulphur2_npu.loader import load_pipeline

    model, results = ltx_peer.transformer(ltx_written), {}
    for name, sound in (("with sound", True), ("silent", False)):
        pipe = load_pipeline(ltx_written, smoke.text_encoder, torch_dtype=torch.float32).pipe
        results[name] = ltx_peer.retake_errors(pipe, model, ltx_written, folder, sound=sound)
        print(f"retake, {name}: {results[name]}")
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np
    from PIL import Image

    from deliverykit.files import ensure_writable_dir
    from deliverykit.report import delivery_report, write_report
    from sulphur2_npu import ltx_peer
    from sulphur2_npu.tiny import TINY_HEIGHT, TINY_WIDTH, SmokeFiles, write_smoke_files

    source = ltx_peer.peer_source()
    if source is None or not (source / "packages" / "ltx-core").is_dir():
        raise InputError(
            f"{ltx_peer.ENV} is {'unset' if source is None else source}: set it to a Lightricks/LTX-2 checkout at "
            f"{ltx_peer.PINNED_COMMIT} (git clone https://github.com/Lightricks/LTX-2 && git checkout <that commit>)"
        )
    ltx_peer.import_peer(source)
    ensure_writable_dir(Path(args.output).parent)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (TINY_HEIGHT, TINY_WIDTH, 3), dtype=np.uint8))
    with tempfile.TemporaryDirectory(prefix="sulphur2-reference-") as tmp:
        folder = Path(tmp)
        smoke = write_smoke_files(folder / "full", seed=0)
        partial = write_smoke_files(folder / "partial", seed=0, omit_sections=("transformer", "vae", "audio_vae"))
        # the transformer as ltx-core builds and names it (the other components are in ltx-core's layout too)
        ltx_written = ltx_peer.write_ltx_core_transformer(smoke.checkpoint, folder / "ltx-core-transformer.safetensors")
        loops = measure_loops(SmokeFiles(ltx_written, smoke.text_encoder), image)
        vae = measure_vae_defaults(smoke, partial, folder)
        vocoder = measure_vocoder(smoke)
        two_stage = measure_two_stage(ltx_written, smoke, image)
        keyframes = measure_keyframes(ltx_written, smoke, folder)
        a2v = measure_a2v(ltx_written, smoke, image)
        retake = measure_retake(ltx_written, smoke, folder)
        noise = measure_noise(ltx_written, smoke, image)

    def row(issue: str, check: str, figures: dict[str, float], tolerance: float, fix: str = "delivery") -> list:
        return [issue, check, f"{figures['stock']:.2g}", f"{figures[fix]:.2g}", f"{tolerance:g}"]

    i2v = loops["dev_i2v"]
    rows = [
        row("STG off (`perturbed_attn=False` kept)", "4-step dev T2V, final latents", loops["dev_t2v"], 1e-3),
        row("I2V cross-attention scale/shift from the other σ", "one I2V forward", loops["forward_i2v"], 1e-4),
        [
            "I2V x0 of the conditioned frame",
            "4-step dev I2V, final latents (STG + cross-attention fixed / all fixed)",
            f"{i2v['+STG+cross']:.2g}",
            f"{i2v['delivery']:.2g}",
            "0.001",
        ],
        row("all three (stock = diffusers as-is)", "4-step dev I2V, final latents", i2v, 1e-3),
        row("all three (T2V forward is unaffected)", "one T2V forward", loops["forward_t2v"], 1e-4),
        row(
            "all three (no guidance, no image)",
            "8-step distilled T2V, final latents",
            loops["distilled_t2v"],
            1e-3,
        ),
        row("no `vae` metadata: loader assumed zero padding", "video VAE decode (ltx-core's defaults)", vae, 1e-4),
        row("vocoder in the pipeline dtype", "BWE vocoder, bf16 pipeline", vocoder, 1e-4),
    ]
    table = {
        "title": "Stock diffusers 0.42.1 vs the delivery, against ltx-core / ltx-pipelines at 400fd310 (tiny random "
        "LTX-2.3 in ltx-core's layout, same inputs, fp32 CPU; max |Δ| / max |reference|, worst of video and audio)",
        "columns": ["issue", "check", "before (stock)", "delivery", "tolerance"],
        "rows": rows,
    }
    stages_table = {
        "title": "The two-stage pipelines against ltx-pipelines' DistilledPipeline / TI2VidTwoStagesPipeline / "
        "TI2VidTwoStagesHQPipeline at 400fd310, stage by stage (tiny random LTX-2.3, upsampler and distilled LoRA in "
        "their released layouts, a first frame's latent given to both sides in the image columns, "
        f"{DEV_STEPS}-step dev stage 1 for two-stage and HQ, whose res_2s loops draw their SDE noise as ltx-pipelines "
        "does; fp32 CPU; max |Δ| / max |reference|)",
        "columns": ["hand-over", *TWO_STAGE_RUNS, "tolerance"],
        "rows": [
            [name, *(f"{two_stage[run][name]:.2g}" for run in TWO_STAGE_RUNS), "0.001"]
            for name in two_stage["distilled"]
        ]
        + [
            [
                "upsampler, one forward (ltx-core's `upsample_video`)",
                f"{two_stage['upsampler']['forward']:.2g}",
                *[""] * (len(TWO_STAGE_RUNS) - 1),
                "0.0001",
            ]
        ],
    }
    keyframes_table = {
        "title": "The keyframes pipeline against ltx-pipelines' KeyframeInterpolationPipeline at 400fd310 (keyframes "
        "at frame 0, strength 1, and at the last frame, strength 0.6, read from files by both; the same tiny model, "
        f"{DEV_STEPS}-step dev stage 1, fp32 CPU; max |Δ| / max |reference|; stock = diffusers' velocity → x0 with "
        "one σ for every token)",
        "columns": ["check", "delivery", "stock", "tolerance"],
        "rows": [
            [
                name,
                f"{keyframes['delivery'][name]:.2g}",
                f"{keyframes['stock'][name]:.2g}",
                "0.001" if name in ("stage 1 video", "stage 2 video", "audio") else "0.0001",
            ]
            for name in keyframes["delivery"]
        ],
    }
    a2v_table = {
        "title": "The a2v pipeline against ltx-pipelines' A2VidPipelineTwoStage at 400fd310 (the smoke's test tone, "
        f"its mel by {a2v['sound']['front end']}; with and without a first frame; the same tiny model, "
        f"{DEV_STEPS}-step dev stage 1, distilled LoRA at 0.8 in stage 2, fp32 CPU; max |Δ| / max |reference|)",
        "columns": ["hand-over", "sound", "sound + image", "tolerance"],
        "rows": [
            [
                name,
                *(f"{a2v[run][name]:.2g}" for run in ("sound", "sound + image")),
                "0.0001" if name == "audio latent" else "0.001",
            ]
            for name in a2v["sound"]
            if name != "front end"
        ],
    }
    retake_table = {
        "title": "The retake pipeline against ltx-pipelines' RetakePipeline at 400fd310 (an mp4 of the smoke's "
        "picture, with the smoke's tone or silent, read by both, span 0.1-0.25 s; its mel by "
        f"{retake['with sound']['front end']}; the same tiny model, the 8 distilled σ, fp32 CPU; max |Δ| / max "
        "|reference|)",
        "columns": ["check", "with sound", "silent", "tolerance"],
        "rows": [
            [
                name,
                *(f"{retake[run][name]:.2g}" if name in retake[run] else "n/a" for run in ("with sound", "silent")),
                "0.001" if name in ("video", "audio") else "0.0001",
            ]
            for name in retake["with sound"]
            if name != "front end"
        ],
    }
    noise_table = {
        "title": "The initial noise from a seed against ltx-pipelines' `_build_state` (`GaussianNoiser`) from the same "
        "seed at 400fd310 (the same tiny model; the video tokens that start as noise and the audio tokens; max |Δ| / "
        "max |reference|; stock = diffusers' pipelines as they are, on the same modules)",
        "columns": ["pipeline", "video, delivery", "video, stock", "audio, delivery", "audio, stock", "expected"],
        "rows": [
            [
                mode,
                *(
                    f"{noise[f'{mode}, {run}'][f'{stream} noise']:.2g}"
                    for stream in ("video", "audio")
                    for run in ("delivery", "stock")
                ),
                "0 (the same draws)",
            ]
            for mode in ("t2v", "i2v")
        ],
    }
    report = delivery_report(
        "benchmark",
        Path(__file__).resolve().parents[1],
        device="cpu",
        random_weights=True,
        results={
            "peer": f"Lightricks/LTX-2 @ {ltx_peer.PINNED_COMMIT}",
            "loops": loops,
            "vae_without_metadata": vae,
            "vocoder_bf16_pipeline": vocoder,
            "two_stage": two_stage,
            "keyframes": keyframes,
            "a2v": a2v,
            "retake": retake,
            "initial_noise": noise,
            "command": COMMAND,
            "tables": [table, stages_table, keyframes_table, a2v_table, retake_table, noise_table],
        },
    )
    write_report(args.output, report)
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
