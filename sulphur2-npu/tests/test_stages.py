"""LTX-2.3's two-stage pipelines on the tiny model: which pipeline a run gets, the parts it loads, and what each stage
hands the next. Equality with ltx-pipelines itself is ``test_reference_ltx.py`` (needs ``LTX2_SRC``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

from deliverykit.errors import DeliveryError, ExitCode, WeightsError
from sulphur2_npu import generate as generate_module
from sulphur2_npu import stages, tiny, upsampler
from sulphur2_npu.accuracy import tiny_request
from sulphur2_npu.loader import load_pipeline
from sulphur2_npu.options import DISTILLED, ONE_STAGE, TWO_STAGE

# ltx-pipelines utils/constants.py at 400fd310 (as quoted in the S4 issue): what stage 2 must sample
STAGE_2_DISTILLED_SIGMA_VALUES = [0.909375, 0.725, 0.421875, 0.0]
DEV_FILE, DISTILLED_FILE = Path("sulphur_dev_bf16.safetensors"), Path("sulphur_distil_bf16.safetensors")


def _choice(requested="auto", schedule="auto", checkpoint=DEV_FILE, upsampler=True, lora=False, smoke=False):
    options = {"upsampler": upsampler, "distilled_lora": lora, "smoke": smoke}
    return stages.choose_pipeline(requested, schedule, checkpoint, **options)


@pytest.mark.parametrize(
    ("kwargs", "pipeline", "schedule"),
    [
        ({"checkpoint": DISTILLED_FILE}, DISTILLED, DISTILLED),
        ({"lora": True}, TWO_STAGE, "dev"),
        ({"upsampler": False}, ONE_STAGE, "dev"),
        ({"smoke": True, "checkpoint": Path(tiny.CHECKPOINT_NAME)}, DISTILLED, DISTILLED),
        ({"smoke": True, "schedule": "dev", "checkpoint": Path(tiny.CHECKPOINT_NAME)}, TWO_STAGE, "dev"),
        ({"requested": ONE_STAGE, "checkpoint": DISTILLED_FILE, "upsampler": False}, ONE_STAGE, DISTILLED),
    ],
    ids=["distilled-file", "dev-with-lora", "dev-alone", "smoke", "smoke-dev", "one-stage"],
)
def test_auto_picks_ltx_pipelines_recommended_pipeline(kwargs, pipeline, schedule):
    choice = _choice(**kwargs)
    assert (choice.pipeline, choice.name) == (pipeline, schedule)


@pytest.mark.parametrize(
    ("kwargs", "error", "code", "names"),
    [
        ({"checkpoint": DISTILLED_FILE, "upsampler": False}, WeightsError, ExitCode.WEIGHTS, upsampler.FILE_NAME),
        ({"requested": TWO_STAGE}, WeightsError, ExitCode.WEIGHTS, stages.DISTILLED_LORA_FILE),
        ({"requested": TWO_STAGE, "schedule": DISTILLED, "lora": True}, DeliveryError, ExitCode.USAGE, "--schedule"),
        ({"checkpoint": DISTILLED_FILE, "lora": True}, DeliveryError, ExitCode.USAGE, "--distilled-lora"),
        ({"requested": ONE_STAGE}, DeliveryError, ExitCode.USAGE, "--spatial-upsampler"),
    ],
    ids=["no-upsampler", "no-lora", "two-stage-distilled-schedule", "unused-lora", "unused-upsampler"],
)
def test_a_missing_part_or_an_unused_flag_is_refused(kwargs, error, code, names):
    with pytest.raises(error) as info:
        _choice(**kwargs)
    assert info.value.exit_code == code and names in str(info.value)


def test_upsampler_config_is_ltx_cores_with_its_defaults():
    """Absent keys take ltx-core's ``LatentUpsamplerConfigurator`` defaults, not diffusers' (mid 1024, rational)."""
    config = upsampler.diffusers_config({"mid_channels": 1024})
    assert config == {
        "in_channels": 128,
        "mid_channels": 1024,
        "num_blocks_per_stage": 4,
        "dims": 3,
        "spatial_upsample": True,
        "temporal_upsample": False,
        "rational_spatial_scale": 2.0,
        "use_rational_resampler": False,
    }
    with pytest.raises(ValueError, match="unknown latent upsampler config keys"):
        upsampler.diffusers_config({"mid_channel": 1024})


def _upsampler_copy(source: Path, path: Path, drop: str | None = None, **config) -> Path:
    with safe_open(str(source), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys() if key != drop}  # noqa: SIM118
        metadata = json.loads(handle.metadata()["config"]) | config
    save_file(tensors, str(path), metadata={"config": json.dumps(metadata)})
    return path


def test_upsampler_loads_strictly(smoke_files, tmp_path):
    module, record = upsampler.load_upsampler(smoke_files.upsampler, latent_channels=8, torch_dtype=torch.float32)
    assert record is None and not any(t.is_meta for t in module.state_dict().values())
    with safe_open(str(smoke_files.upsampler), framework="pt") as handle:
        assert torch.equal(module.state_dict()["final_conv.weight"], handle.get_tensor("final_conv.weight"))
    cases = [
        (tmp_path / "absent.safetensors", 8, "does not exist"),
        (_upsampler_copy(smoke_files.upsampler, tmp_path / "cut.safetensors", drop="initial_conv.bias"), 8, "missing"),
        (smoke_files.upsampler, 128, "takes 8-channel latents"),
    ]
    for path, channels, message in cases:
        with pytest.raises(WeightsError, match=message) as info:
            upsampler.load_upsampler(path, latent_channels=channels, torch_dtype=torch.float32)
        assert upsampler.FILE_NAME in str(info.value)


@pytest.fixture
def pipe(smoke_files):
    """A fresh tiny pipeline for each test: tests load LoRAs and hooks into it."""
    return load_pipeline(smoke_files.checkpoint, smoke_files.text_encoder, torch_dtype=torch.float32).pipe


def test_decode_is_the_pipelines_own_tail(pipe):
    """One call with ``output_type="np"`` equals the same call's latents through :func:`stages.decode`."""
    request = tiny_request()
    kwargs = generate_module.pipeline_kwargs(pipe, request)
    outputs = [
        pipe(**{**kwargs, "output_type": kind}, generator=torch.Generator().manual_seed(3)) for kind in ("np", "latent")
    ]
    frames, audio = stages.decode(pipe, outputs[1].frames, outputs[1].audio)
    np.testing.assert_allclose(frames, outputs[0].frames[0], atol=1e-6)  # same ops, same order: float32 round-off
    torch.testing.assert_close(audio, outputs[0].audio[0].float(), atol=1e-6, rtol=0)


def _two_stage_request(pipeline: str, **fields):
    steps, guidance, schedule = (8, 1.0, DISTILLED) if pipeline == DISTILLED else (2, 3.0, "dev")
    size = {"width": tiny.TINY_TWO_STAGE_PRESET.width, "height": tiny.TINY_TWO_STAGE_PRESET.height}
    settings = {"steps": steps, "guidance": guidance, "schedule": schedule, "pipeline": pipeline}
    return dataclasses.replace(tiny_request(), **size, **settings, **fields)


@pytest.mark.parametrize("pipeline", [DISTILLED, TWO_STAGE])
def test_stage_2_starts_from_the_upsampled_stage_1_latent(pipe, smoke_files, monkeypatch, pipeline):
    """Stage 2's first input is ``(1 - σ) · upsampled + σ · noise`` at σ = 0.909375 (ltx-core's ``GaussianNoiser``),
    its σ are ltx-pipelines' stage-2 values, and the LoRA is on in stage 2 only for ``two-stage``."""
    parts = stages.load_stage_parts(
        pipe, pipeline, upsampler=smoke_files.upsampler, distilled_lora=(smoke_files.distilled_lora, 0.8)
    )
    calls, upsampled, active = [], [], []

    def record(module, args, kwargs):
        calls.append(kwargs["hidden_states"].clone())
        layers = [layer for layer in module.modules() if hasattr(layer, "lora_A") and layer.lora_A]
        active.append(
            tuple(sorted({name for layer in layers if not layer.disable_adapters for name in layer.active_adapters}))
        )

    pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    original = generate_module.upsample
    monkeypatch.setattr(generate_module, "upsample", lambda m, x: upsampled.append(original(m, x)) or upsampled[-1])
    result = generate_module.generate(pipe, _two_stage_request(pipeline), device="cpu", parts=parts)

    assert result.stages["stage_2"]["sigmas"] == pytest.approx(STAGE_2_DISTILLED_SIGMA_VALUES)
    assert (result.stages["stage_1"]["width"], result.stages["stage_2"]["width"]) == (64, 128)
    first_of_stage_2 = next(
        i for i, call in enumerate(calls) if call.shape[1] == result.stages["stage_2"]["video_tokens"]
    )
    vae = pipe.vae
    clean = pipe._pack_latents(pipe._normalize_latents(upsampled[0], vae.latents_mean, vae.latents_std), 1, 1)
    noise = (calls[first_of_stage_2] - (1 - 0.909375) * clean) / 0.909375
    assert abs(float(noise.mean())) < 0.5 and 0.5 < float(noise.std()) < 1.5  # unit Gaussian noise, not the latent
    assert float((noise - clean).abs().max()) > 0.1
    if pipeline == TWO_STAGE:
        assert set(active[:first_of_stage_2]) == {()}
        assert set(active[first_of_stage_2:]) == {(stages.DISTILLED_LORA_ADAPTER,)}
    stages.use_adapters(pipe, {})


def test_image_to_video_stage_2_conditions_on_the_full_size_image(smoke_files, monkeypatch):
    """The first latent frame of stage 2 is the image encoded at full size (ltx-pipelines'
    ``combined_image_conditionings``), kept clean (timestep 0), not the upsampled stage-1 frame."""
    loaded = load_pipeline(
        smoke_files.checkpoint, smoke_files.text_encoder, image_to_video=True, torch_dtype=torch.float32
    ).pipe
    parts = stages.load_stage_parts(loaded, DISTILLED, upsampler=smoke_files.upsampler, distilled_lora=None)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 128, 3), dtype=np.uint8))
    calls = []
    loaded.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append({k: kwargs[k].clone() for k in ("hidden_states", "timestep")}),
        with_kwargs=True,
    )
    request = _two_stage_request(DISTILLED, image=image)
    generate_module.generate(loaded, request, device="cpu", generator=torch.Generator().manual_seed(0), parts=parts)
    second = next(call for call in calls if call["hidden_states"].shape[1] == 16)
    expected = stages.encode_first_frame(loaded, image, stages.StageSize(128, 64))
    vae = loaded.vae
    expected = loaded._pack_latents(loaded._normalize_latents(expected, vae.latents_mean, vae.latents_std), 1, 1)
    frame_tokens = expected.shape[1]  # one latent frame: the first tokens of the sequence
    torch.testing.assert_close(second["hidden_states"][:, :frame_tokens], expected, atol=1e-5, rtol=0)
    assert bool((second["timestep"].reshape(1, -1)[:, :frame_tokens] == 0).all())
    assert bool((second["timestep"].reshape(1, -1)[:, frame_tokens:] > 0).all())


@pytest.mark.parametrize("pipeline", [DISTILLED, TWO_STAGE])
def test_smoke_runs_the_pipeline_end_to_end(run_cli, tmp_path, pipeline):
    code, out, err = run_cli("--smoke", "--device", "cpu", "--pipeline", pipeline, "--output", tmp_path / "out.mp4")
    assert code == ExitCode.OK, err
    assert f"PIPELINE={pipeline}" in out and "OUTPUT_SHAPE=[9, 64, 128, 3]" in out
    report = json.loads((tmp_path / "report.json").read_text())
    recorded = report["timing"]["stages"]
    assert report["inputs"]["pipeline"] == pipeline
    assert [recorded[name]["video_tokens"] for name in ("stage_1", "stage_2")] == [2 * 1 * 2, 2 * 2 * 4]
    assert recorded["upsample"]["latent_shape"] == [1, 8, 2, 2, 4]
    assert recorded["decode"]["audio_from"] == ("stage_2" if pipeline == DISTILLED else "stage_1")
    adapters = report["model"]["stage_adapters"]
    assert adapters["stage_2"] == ({stages.DISTILLED_LORA_ADAPTER: 1.0} if pipeline == TWO_STAGE else {})


def test_a_size_stage_1_cannot_halve_is_a_usage_error(run_cli, tmp_path):
    code, _, err = run_cli("--smoke", "--device", "cpu", "--width", 96, "--output", tmp_path / "out.mp4")
    assert code == ExitCode.USAGE and "--width 96 is not a positive multiple of 64 (nearest valid: 64 or 128)" in err
    assert not list(tmp_path.iterdir())


def test_a_batch_line_may_ask_for_one_stage(run_cli, tmp_path):
    """The run loads the distilled pipeline's parts; a line may run it or one stage (at a size one stage allows)."""
    lines = [{"prompt": "a", "seed": 1}, {"prompt": "b", "seed": 2, "pipeline": ONE_STAGE, "width": 96}]
    batch = tmp_path / "b.jsonl"
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, _, err = run_cli("--smoke", "--device", "cpu", "--batch", batch, "--output", tmp_path / "out")
    assert code == ExitCode.OK, err
    reports = [json.loads((tmp_path / "out" / f"{i:05d}" / "report.json").read_text()) for i in range(2)]
    assert [(r["inputs"]["pipeline"], r["inputs"]["width"]) for r in reports] == [(DISTILLED, 128), (ONE_STAGE, 96)]
    assert reports[1]["timing"]["stages"] is None
    batch.write_text(json.dumps({"prompt": "c", "pipeline": TWO_STAGE}) + "\n")
    code, _, err = run_cli("--smoke", "--device", "cpu", "--batch", batch, "--output", tmp_path / "again")
    assert (
        code == ExitCode.USAGE and "b.jsonl:1: pipeline 'two-stage': this run loaded the parts of the distilled" in err
    )


@pytest.mark.parametrize("flag", ["--spatial-upsampler", "--distilled-lora"])
def test_a_missing_part_file_is_refused_before_loading(run_cli, tmp_path, flag):
    """Checked before the checkpoint is read: the checkpoint named here does not exist either."""
    argv = ["--model", tmp_path / "sulphur_dev_bf16.safetensors", "--text-encoder", tmp_path, "--prompt", "x"]
    argv += ["--spatial-upsampler", tmp_path / "up.safetensors", "--distilled-lora", tmp_path / "lora.safetensors"]
    if flag == "--distilled-lora":
        (tmp_path / "up.safetensors").write_bytes(b"")
    code, _, err = run_cli(*argv, "--output", tmp_path / "out.mp4")
    assert code == ExitCode.WEIGHTS and err.count("error:") == 1 and f"{flag} " in err and "does not exist" in err
    assert "Traceback" not in err and not (tmp_path / "out.mp4").exists()
