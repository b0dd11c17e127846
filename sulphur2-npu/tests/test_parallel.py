"""Several cards: --parallel checks (exit 2 before loading) and guidance-pass parallel on CPU gloo ranks.

The multi-rank tests launch ``torchrun`` jobs of ``parallel_job.py`` (the tiny LTX-2.3 through the real loader, fp32)
and compare rank 0's frames and audio with the same script run as one process. Different processes (and thread
counts) may round differently, so they compare within deliverykit.testing's reordering tolerance, 2**8 float32 ulps
of the peak (3e-5): a rank runs its guidance rows at another batch size (other GEMM kernels) and Ulysses changes the
attention's summation order (measured max |Δ| on the frames 2.5e-6 to 1.1e-5; a wrong plan or row is off by 0.6).
The default tiny model has 2 heads, so U=4 runs on ``tiny-heads8`` (8 heads, 128x64x9: 16 video tokens); U=8 on it
takes 8 processes on CI's 2 cores and is in scripts/parallel_parity.py instead.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from deliverykit.errors import DeliveryError, ExitCode
from deliverykit.testing import REORDERING_ULPS, assert_equal_up_to_reordering, load_script
from sulphur2_npu.generate import guidance_kwargs
from sulphur2_npu.parallel import (
    COND,
    MODALITY,
    STG,
    UNCOND,
    ParallelSpec,
    check_guidance_degree,
    guidance_groups,
    guidance_rows,
    parse_parallel,
)

TESTS = Path(__file__).resolve().parent
JOB = TESTS.parent / "scripts" / "parallel_job.py"
TOLERANCE = REORDERING_ULPS * float(np.finfo(np.float32).eps)  # relative to the peak, fp32 (module docstring)


@pytest.mark.parametrize(
    ("text", "world", "expected"),
    [
        (None, 1, ParallelSpec()),
        ("guidance=2", 2, ParallelSpec(guidance=2)),
        ("guidance=4", 4, ParallelSpec(guidance=4)),
        ("ulysses=1,guidance=2", 2, ParallelSpec(guidance=2)),
        ("ulysses=8", 8, ParallelSpec(ulysses=8)),
        ("guidance=2,ulysses=4", 8, ParallelSpec(ulysses=4, guidance=2)),
    ],
)
def test_parse_parallel(text, world, expected):
    assert parse_parallel(text, world) == expected


@pytest.mark.parametrize(
    ("text", "world", "names"),
    [
        (None, 2, "no --parallel"),
        ("ulysses=3", 3, "divide 32"),
        ("ulysses=0", 1, "divide 32"),
        ("guidance=3", 3, "1, 2 or 4"),
        ("guidance=2", 4, "= 2 but torchrun started 4"),
        ("ulysses=2,guidance=2", 8, "= 4 but torchrun started 8"),
        ("guidance=2,guidance=2", 4, "expected ulysses=U"),
        ("tp=2", 2, "expected ulysses=U"),
    ],
)
def test_bad_parallel_is_a_usage_error(text, world, names):
    with pytest.raises(DeliveryError) as info:
        parse_parallel(text, world)
    assert info.value.exit_code == ExitCode.USAGE and names in str(info.value)


def test_guidance_rows_follow_the_pipeline_rules():
    full = guidance_kwargs(3.0, num_layers=48)
    assert guidance_rows(full) == (UNCOND, COND, STG, MODALITY)
    assert guidance_rows(guidance_kwargs(1.0, num_layers=48)) == (COND,)
    check_guidance_degree(ParallelSpec(guidance=4), 4)
    with pytest.raises(DeliveryError) as info:  # distilled: one pass per step, nothing to split
        check_guidance_degree(ParallelSpec(guidance=2), 1)
    assert info.value.exit_code == ExitCode.USAGE


def test_guidance_groups_are_ranks_with_the_same_ulysses_index():
    assert guidance_groups(ParallelSpec(guidance=4), 3) == (3, [[0, 1, 2, 3]])
    assert guidance_groups(ParallelSpec(ulysses=2, guidance=2), 3) == (1, [[0, 2], [1, 3]])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun(ranks: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
    command += ["--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(JOB), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """Frames and audio of the one-process run of each mode (the reference), computed on first use."""
    job = load_script(JOB, "parallel_job")
    folder = tmp_path_factory.mktemp("single")
    cache: dict[tuple[str, str], dict[str, np.ndarray]] = {}

    def get(mode: str, model: str = "tiny") -> dict[str, np.ndarray]:
        if (mode, model) not in cache:
            path = folder / f"{mode}-{model}.npz"
            job.main([str(path), mode, f"--model={model}"])
            cache[mode, model] = dict(np.load(path))
        return cache[mode, model]

    return get


def _assert_close(parallel: dict[str, np.ndarray], single: dict[str, np.ndarray]) -> dict[str, float]:
    deltas = {}
    for name in ("video", "audio"):
        assert parallel[name].shape == single[name].shape
        deltas[name] = float(np.abs(parallel[name] - single[name]).max())
        assert deltas[name] <= TOLERANCE * float(np.abs(single[name]).max()), (name, deltas[name])
    return deltas


@pytest.mark.parametrize(
    ("mode", "spec", "model"),
    [
        ("t2v", "guidance=2", "tiny"),
        ("i2v", "guidance=2", "tiny"),
        ("t2v", "guidance=4", "tiny"),
        ("t2v", "ulysses=2", "tiny"),
        ("i2v", "ulysses=2", "tiny"),
        ("distilled", "ulysses=2", "tiny"),
        ("t2v", "ulysses=2,guidance=2", "tiny"),
        ("t2v", "ulysses=4", "tiny-heads8"),
        ("t2v", "ulysses=2,guidance=2", "tiny-heads8"),
    ],
)
@pytest.mark.heavy
def test_parallel_equals_one_process(tmp_path, single_process, mode, spec, model):
    parsed = parse_parallel(spec, world_size=int(np.prod([int(p.split("=")[1]) for p in spec.split(",")])))
    output = tmp_path / "out.npz"
    done = _torchrun(parsed.world_size, str(output), mode, f"--parallel={spec}", f"--model={model}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parallel = dict(np.load(output))
    _assert_close(parallel, single_process(mode, model))
    # guidance groups receive the rows they did not compute: (G-1)/G of 4 rows of video + audio velocity per step
    assert (int(parallel["comm"]) > 0) == (parsed.guidance > 1)


@pytest.mark.heavy
def test_two_localhost_nodes_equal_one_process(tmp_path, single_process):
    """``torchrun --nnodes 2 --node-rank 0|1`` (one rank each, static rendezvous), ulysses=2: the multi-node path."""
    output = tmp_path / "out.npz"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    launcher += ["--master-addr=127.0.0.1", f"--master-port={_free_port()}"]
    procs = [
        subprocess.Popen(
            [*launcher, f"--node-rank={node}", str(JOB), str(output), "t2v", "--parallel=ulysses=2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    logs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    _assert_close(dict(np.load(output)), single_process("t2v"))


@pytest.mark.heavy
def test_exception_on_rank_1_ends_every_rank_without_output(tmp_path):
    output = tmp_path / "out.npz"
    done = _torchrun(2, str(output), "t2v", "--parallel=guidance=2", "--fail-on-rank=1")
    log = done.stdout + done.stderr
    assert done.returncode != 0 and not output.exists()
    assert "RuntimeError: injected failure on rank 1" in log
    assert "error: another rank failed (rank 1: injected failure on rank 1)" in log
    assert f"EXIT_CODE={int(ExitCode.DISTRIBUTED)}" in log


TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.mark.parametrize(
    ("extra", "env", "match"),
    [
        (("--parallel", "guidance=2"), {}, "torchrun started 1 rank"),
        (("--parallel", "ulysses=6"), {}, "must divide 32"),
        ((), TORCHRUN_ENV, "2 ranks but no --parallel"),
        (("--parallel", "guidance=2", "--schedule", "distilled"), TORCHRUN_ENV, "needs a step with 2 or 4 guidance"),
        (
            ("--parallel", "ulysses=8"),
            {**TORCHRUN_ENV, "WORLD_SIZE": "8"},
            "splits the video tokens evenly, but there are 12",
        ),
    ],
)
def test_inference_refuses_a_bad_parallel_before_loading(run_cli, monkeypatch, tmp_path, extra, env, match):
    """Exit 2 with one error line; MASTER_PORT 1 would fail to connect, so nothing reached the process group."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    one_stage = ("--pipeline", "one-stage")  # the token counts of one call at the full size
    code, _, err = run_cli("--smoke", "--device", "cpu", *one_stage, "--output", tmp_path / "out.mp4", *extra)
    assert code == ExitCode.USAGE and err.count("error:") == 1 and match in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("spec", "pipeline"),
    [
        ("guidance=2", "one-stage"),
        pytest.param("ulysses=2", "distilled", marks=pytest.mark.heavy),
        pytest.param("ulysses=2", "keyframes", marks=pytest.mark.heavy),
        pytest.param("ulysses=2", "a2v", marks=pytest.mark.heavy),
        pytest.param("ulysses=2", "retake", marks=pytest.mark.heavy),
        pytest.param("ulysses=2", "two-stage-hq", marks=pytest.mark.heavy),
    ],
)
def test_inference_on_two_ranks_writes_once_what_one_process_writes(run_cli, tmp_path, spec, pipeline):
    """Guidance groups on one call; Ulysses on both stages of the default pipeline (stage 1: 4 video tokens) and of
    the keyframes pipeline (two keyframes: 4 more tokens in stage 1, 16 in stage 2, split with the video's) and of
    the a2v pipeline (the sound held in both stages) and of the retake pipeline (the kept tokens split with the
    others, the sound's per-token timesteps whole on every rank)."""
    single, multi = tmp_path / "single", tmp_path / "multi"
    single.mkdir(), multi.mkdir()
    smoke = ("--smoke", "--device", "cpu", "--pipeline", pipeline)
    if pipeline == "keyframes":
        for name, colour in (("a.png", (200, 40, 40)), ("b.png", (40, 40, 200))):
            Image.new("RGB", (128, 64), colour).save(tmp_path / name)
        smoke += ("--keyframe", f"{tmp_path / 'a.png'}:0", "--keyframe", f"{tmp_path / 'b.png'}:8:0.7")
    code, _, err = run_cli(*smoke, "--output", single / "out.mp4")
    assert code == 0, err
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1"]
    command += [f"--master-port={_free_port()}", str(TESTS.parent / "inference.py"), *smoke]
    command += ["--output", str(multi / "out.mp4"), "--parallel", spec]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in multi.iterdir()) == ["out.mp4", "out_first.png", "out_last.png", "report.json"]
    expected = parse_parallel(spec, 2)
    evidence = f"PARALLEL=ulysses={expected.ulysses},guidance={expected.guidance}"
    assert done.stdout.count(evidence) == 1  # rank 0 alone prints the evidence
    report = json.loads((multi / "report.json").read_text())
    assert report["inputs"]["parallel"] == expected.as_dict() and report["inputs"]["world_size"] == 2
    for name in ("out_first.png", "out_last.png"):  # 8-bit frames: one level of rounding allowed (docstring)
        a, b = (np.asarray(Image.open(folder / name), dtype=np.int16) for folder in (single, multi))
        assert np.abs(a - b).max() <= 1


def _recorded_call(tiny_components, image_to_video: bool) -> dict:
    """The keyword arguments of the first transformer call of a tiny pipeline run (T2V or I2V, full guidance)."""
    from sulphur2_npu.tiny import TINY_CALL, tiny_pipeline

    pipe = tiny_pipeline(components=tiny_components, image_to_video=image_to_video)
    calls = []
    handle = pipe.transformer.register_forward_pre_hook(lambda m, a, k: calls.append(dict(k)), with_kwargs=True)
    extra = {"image": Image.new("RGB", (96, 64)), "image_crf": 0} if image_to_video else {}
    try:
        pipe(**{**TINY_CALL, "num_inference_steps": 2}, generator=torch.Generator().manual_seed(0), **extra)
    finally:
        handle.remove()
    return calls[0]


@pytest.mark.parametrize("image_to_video", [False, True], ids=["t2v", "i2v"])
def test_plan_covers_every_input_with_a_token_axis(tiny_components, image_to_video):
    from diffusers import LTX2VideoTransformer3DModel

    from sulphur2_npu.ulysses import LTX23_CP_PLAN, unplanned_inputs

    kwargs = _recorded_call(tiny_components, image_to_video)
    tokens = {kwargs[name].shape[1] for name in ("hidden_states", "encoder_hidden_states", "audio_hidden_states")}
    assert unplanned_inputs(LTX23_CP_PLAN, kwargs, tokens) == []
    shipped = unplanned_inputs(LTX2VideoTransformer3DModel._cp_plan, kwargs, tokens)  # LTX-1's plan, diffusers 0.42.1
    assert "video_coords" in shipped and ("timestep" in shipped) == image_to_video


SPLIT_DECODE = textwrap.dedent(
    """
    import sys
    import numpy as np, torch
    from diffusers import AutoencoderKLLTX2Video
    from deliverykit.distributed import destroy_distributed, init_distributed
    from deliverykit.random_weights import randomize_
    from sulphur2_npu.split_decode import split_tiled_decode
    from sulphur2_npu.tiny import VAE_CONFIG

    context = init_distributed("cpu")
    vae = AutoencoderKLLTX2Video(**VAE_CONFIG).eval()
    randomize_(vae, 0)
    # 64 px tiles every 32 px on a 3x5 latent (96x160 px): 3 x 5 tiles, 32 px blended on each side
    vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_stride_height=32,
                      tile_sample_stride_width=32)
    decoded = []
    forward = vae.decoder.forward
    vae.decoder.forward = lambda *args, **kwargs: decoded.append(1) or forward(*args, **kwargs)  # counts real tiles
    if context.distributed:
        split_tiled_decode(vae, rank=context.rank, world_size=context.world_size, device=context.device)
    z = torch.randn(1, 8, 2, 3, 5, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        video = vae.decode(z, return_dict=False)[0]
    print(f"RANK{context.rank} decoded={len(decoded)}", flush=True)
    np.save(f"{sys.argv[1]}{context.rank}.npy", video.numpy())
    destroy_distributed(context)
    """
)


@pytest.mark.heavy
def test_split_tiled_decode_on_two_ranks_equals_the_one_process_tiled_decode(tmp_path):
    """diffusers' tiled VAE decode with its tiles split over 2 gloo ranks (sulphur2_npu.split_decode): every rank ends
    with the one-process tiled video (the same decoder on the same tiles, then diffusers' blend: equal within float32
    reordering), and the ranks decoded disjoint shares of the tiles."""
    script = tmp_path / "split_decode.py"
    script.write_text(SPLIT_DECODE)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run([sys.executable, str(script), str(tmp_path / "single")], env=env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1"]
    command += [f"--master-port={_free_port()}", str(script), str(tmp_path / "split")]
    split = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert split.returncode == 0, split.stdout[-3000:] + split.stderr[-3000:]
    assert "RANK0 decoded=15" in single.stdout  # 3 x 5 tiles in one process
    assert "RANK0 decoded=8" in split.stdout and "RANK1 decoded=7" in split.stdout
    reference = np.load(tmp_path / "single0.npy")
    for rank in (0, 1):
        assert_equal_up_to_reordering(np.load(tmp_path / f"split{rank}.npy"), reference, f"rank {rank}")
