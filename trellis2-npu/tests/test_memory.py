"""Memory plans (``--memory``): what ``auto`` picks per card and pipeline type, the expected peaks from the manifest's
bytes, the flag's refusals, and the placement a plan gives the pipeline. The CPU runs that record the plan in
report.json are in test_pipeline_upstream.py (they need ``$TRELLIS2_SRC``)."""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace

import pytest
import torch

from deliverykit import memory_plans
from deliverykit.errors import ExitCode
from deliverykit.memory_plans import ASCEND_CARDS, GB
from deliverykit.testing import CliRunner
from trellis2_npu import memory
from trellis2_npu.options import PIPELINE_TYPES

from .conftest import DELIVERY_DIR


def _free(gb: float) -> int:
    return int(gb * GB)


def _manifest_gb() -> float:
    """Every required safetensors file of the manifest, read here without the module's code."""
    models = json.loads((DELIVERY_DIR / "weights-manifest.json").read_text(encoding="utf-8"))["models"]
    files = [f for model in models for f in model["files"] if f["required"] and f["path"].endswith(".safetensors")]
    return sum(f["bytes"] for f in files) / GB


@pytest.mark.parametrize("card", ASCEND_CARDS, ids=lambda card: f"{card.hbm_gb}GB")
@pytest.mark.parametrize("pipeline_type", PIPELINE_TYPES)
def test_auto_keeps_every_model_resident_where_it_fits(card, pipeline_type):
    plan = memory.choose_memory_plan("npu:0", free_bytes=_free(card.free_gb), pipeline_types=(pipeline_type,))
    assert (plan.name, plan.pipeline_type, plan.offloaded_to) == ("none", pipeline_type, None)
    assert plan.expected_peak_gb <= card.free_gb and f"{card.free_gb:.1f} GB free >=" in plan.why


@pytest.mark.parametrize("pipeline_type", PIPELINE_TYPES)
def test_auto_offloads_per_stage_where_everything_does_not_fit(pipeline_type):
    """A card with less free memory than ``none`` needs (a 910B4 shared with another process) runs stage by stage,
    its models waiting in host memory, and that plan's peak fits."""
    need = memory.make_plan("none", "", "npu:0", (pipeline_type,)).expected_peak_gb
    free = need - 0.5
    plan = memory.choose_memory_plan("npu:0", free_bytes=_free(free), pipeline_types=(pipeline_type,))
    assert (plan.name, plan.offloaded_to, plan.loads_per_stage) == ("stage-offload", "host memory", False)
    assert plan.expected_peak_gb < free
    assert plan.why == f"{free:.1f} GB free < {need:.1f} GB needed by none"


def test_a_server_plans_for_its_largest_pipeline_type():
    """Free memory enough for a 1024 run but not for a 1536 cascade: ``inference.py --pipeline 1024_cascade`` keeps
    everything resident, a server (whose requests may ask for the cascade) offloads."""
    free = _free(memory.expected_peak_gb("none", "1024_cascade") + 0.5)
    assert memory.choose_memory_plan("npu:0", free_bytes=free, pipeline_types=("1024_cascade",)).name == "none"
    server = memory.choose_memory_plan("npu:0", free_bytes=free)
    assert (server.name, server.pipeline_type) == ("stage-offload", "1536_cascade")


def test_expected_peaks_come_from_the_manifest_bytes_and_the_workspace():
    sizes = memory.model_gb()
    assert set(sizes) == set(memory.resident_models())  # every model none keeps has its size, and nothing else
    assert sum(sizes.values()) == pytest.approx(_manifest_gb())
    largest_model = max(sizes.values())
    for pipeline_type in PIPELINE_TYPES:
        workspace = max(stage.workspace_gb for stage in memory.pipeline_stages(pipeline_type))
        resident = memory.expected_peak_gb("none", pipeline_type)
        staged = memory.expected_peak_gb("stage-offload", pipeline_type)
        assert resident == pytest.approx(_manifest_gb() + workspace)
        assert largest_model < staged <= largest_model + workspace < resident
    # a decoder's workspace grows with its output voxels: the 1536 cascade's stage-by-stage peak is the largest
    peaks = [memory.expected_peak_gb("stage-offload", pipeline_type) for pipeline_type in PIPELINE_TYPES]
    assert max(peaks) == memory.expected_peak_gb("stage-offload", "1536_cascade") > peaks[0]


def test_workspace_inputs_match_their_sources():
    """The 512 asset is the released-size run's (results/pipeline_full.json), the flow's bytes per token its
    configuration's: (6 × 1536 + 2 × 8192) × 2."""
    measured = json.loads((DELIVERY_DIR / "results" / "pipeline_full.json").read_text(encoding="utf-8"))["results"]
    tokens, voxels, _ = memory.asset_size(512)
    assert (tokens, voxels) == (measured["tokens"]["shape_slat_flow_model_512"], measured["tokens"]["voxels"])
    assert memory.flow_bytes_per_token() == 51_200
    scaled = memory.asset_size(1536)
    assert scaled.voxels == round(memory.asset_size(1024).voxels * 2.25)


def test_the_cpu_loads_per_stage_and_has_no_device_peak(monkeypatch):
    cpu = memory.choose_memory_plan("cpu")
    assert (cpu.name, cpu.offloaded_to, cpu.loads_per_stage, cpu.expected_peak_gb) == (
        "stage-offload", "disk", True, None)  # fmt: skip
    resident = memory.choose_memory_plan("cpu", "none")
    assert (resident.loads_per_stage, resident.why) == (False, "requested with --memory none")
    monkeypatch.setattr(memory_plans, "memory_info", lambda device: None)
    unknown = memory.choose_memory_plan("npu:0")
    assert unknown.name == "stage-offload" and unknown.why.startswith("free memory of npu:0 unknown")
    monkeypatch.setattr(memory_plans, "memory_info", lambda device: (_free(61.0), _free(64)))
    assert memory.choose_memory_plan("npu:0").name == "none"


def _model_gb(component: str) -> float:
    models = json.loads((DELIVERY_DIR / "weights-manifest.json").read_text(encoding="utf-8"))["models"]
    files = [f for model in models for f in model["files"] if f["component"] == component and f["required"]]
    return sum(f["bytes"] for f in files if f["path"].endswith(".safetensors")) / GB


@pytest.mark.parametrize("plan", ["none", "stage-offload"])
@pytest.mark.parametrize("half", [torch.float16, torch.float32], ids=["fp16-decoders", "fp32-decoders"])
def test_a_cascades_need_is_its_largest_stage_after_the_upsample(plan, half, monkeypatch):
    """What the stages sized by the cascade's grid add, written out from the manifest and the module's constants:
    the 1024 flows (bf16 model, 51,200 B per token) and the decoders (fp16 models, 1 KiB per voxel + 1.5 GB,
    twice both where the device computes them in fp32), the voxels the typical asset's per token; models only
    under stage-offload (under none they are already on the device)."""
    monkeypatch.setattr(memory, "half_compute_dtype", lambda device: half)
    typical = memory.asset_size(1024)
    scale = half.itemsize / 2
    models = plan != "none"
    for tokens in (1_000, 10_466, 40_000):
        voxels = round(tokens * typical.voxels / typical.tokens)
        flows = [models * _model_gb(f"{kind}_slat_flow_model_1024") + tokens * 51_200 / GB for kind in ("shape", "tex")]
        decoders = [
            scale * (models * _model_gb(f"{kind}_slat_decoder") + voxels * 1024 / GB + 1.5) for kind in ("shape", "tex")
        ]
        need = memory.cascade_need_gb(plan, "1536_cascade", tokens, "npu:0")
        assert need == pytest.approx(max(*flows, *decoders))


@pytest.mark.parametrize("free_gb", [4.0, 9.0, 15.0, 25.0])
@pytest.mark.parametrize("plan_name", ["none", "stage-offload"])
def test_the_token_budget_is_the_most_tokens_that_fit(free_gb, plan_name):
    """Upstream keeps a grid whose 1024-flow tokens are below ``max_num_tokens``: the budget lets through exactly
    the token counts whose need fits the free memory (``max_num_tokens - 1`` fits, ``max_num_tokens`` does not), and
    is upstream's default once that fits."""
    plan = memory.make_plan(plan_name, "test", "npu:0", ("1536_cascade",))
    budget = memory.token_budget(plan, "1536_cascade", "npu:0", free_bytes=_free(free_gb))
    need = functools.partial(memory.cascade_need_gb, plan_name, "1536_cascade", device="npu:0")
    assert budget.free_gb == free_gb
    if budget.max_num_tokens == memory.UPSTREAM_MAX_NUM_TOKENS:
        assert need(tokens=budget.max_num_tokens) <= free_gb and budget.why.startswith("upstream's default")
    else:
        assert need(tokens=budget.max_num_tokens - 1) <= free_gb < need(tokens=budget.max_num_tokens)
        assert f"{free_gb:.1f} GB free hold {budget.max_num_tokens - 1} tokens" in budget.why
    larger = memory.token_budget(plan, "1536_cascade", "npu:0", free_bytes=_free(free_gb + 3))
    assert larger.max_num_tokens >= budget.max_num_tokens  # more memory never lowers the grid


def test_the_token_budget_defaults_to_upstreams_and_the_flag_wins(monkeypatch):
    plan = memory.make_plan("stage-offload", "test", "npu:0")
    tight = _free(5.0)
    flag = memory.token_budget(plan, "1536_cascade", "npu:0", requested=20_000, free_bytes=tight)
    assert (flag.max_num_tokens, flag.why, flag.free_gb) == (20_000, "--max-num-tokens", None)
    for pipeline_type in ("512", "1024"):  # no cascade: nothing to lower
        assert memory.token_budget(plan, pipeline_type, "npu:0", free_bytes=tight).max_num_tokens == 49_152
    monkeypatch.setattr(memory, "free_memory", lambda device: None)  # the device cannot say
    unknown = memory.token_budget(plan, "1536_cascade", "npu:0")
    assert (unknown.max_num_tokens, unknown.why, unknown.free_gb) == (49_152, "upstream's default", None)


def test_a_lowered_grid_is_said_and_a_kept_one_is_not():
    budget = memory.TokenBudget(20_001, "24.0 GB free hold 20000 tokens, estimated")
    assert budget.degraded("1536_cascade", 1536, 19_000) is None
    assert budget.degraded("1024_cascade", 1024, 30_000) is None  # upstream's floor: the grid asked for
    said = budget.degraded("1536_cascade", 1280, 16_500)
    assert said.startswith("1536_cascade ran at 1280³, not 1536³") and "16500 tokens" in said
    assert "max_num_tokens is 20001 (24.0 GB free hold 20000 tokens, estimated)" in said


def test_the_report_lists_each_stages_models():
    staged = memory.make_plan("stage-offload", "test", "npu:0", ("1024_cascade",)).as_dict()
    stages = {row["stage"]: row for row in staged["stages"]}
    upsample = stages["decoder:shape_slat_decoder.upsample"]
    assert upsample["resident"] == ["shape_slat_decoder"] and "shape_slat_flow_model_1024" in upsample["offloaded"]
    assert "tex_slat_flow_model_512" not in upsample["offloaded"]  # not used by the cascade
    resident = memory.make_plan("none", "test", "npu:0", ("512",)).as_dict()
    assert all(row["offloaded"] == [] and len(row["resident"]) == 10 for row in resident["stages"])


@pytest.mark.parametrize(("name", "low_vram"), [("none", False), ("stage-offload", True)])
def test_apply_sets_upstreams_low_vram_before_moving(name, low_vram):
    moves = []
    pipeline = SimpleNamespace(low_vram=True)
    pipeline.to = lambda device: moves.append((device, pipeline.low_vram))
    memory.apply_memory_plan(pipeline, memory.make_plan(name, "test", "npu:0"), "npu:0")
    assert moves == [("npu:0", low_vram)]


def test_unknown_plans_are_refused(run_cli, tmp_path):
    with pytest.raises(ValueError, match="expected one of auto, none, stage-offload"):
        memory.choose_memory_plan("cpu", "sequential")
    out = tmp_path / "o"
    code, _, err = run_cli("--smoke", "tiny", "--memory", "sequential", "--output", out)
    assert code == ExitCode.USAGE and "--memory: invalid choice: 'sequential'" in err and not out.exists()
    for script in ("serve.py", "app.py"):
        with pytest.raises(SystemExit) as refused:
            CliRunner(DELIVERY_DIR / script).module.parse_args(["--smoke", "tiny", "--memory", "sequential"])
        assert refused.value.code == ExitCode.USAGE
    args = CliRunner(DELIVERY_DIR / "serve.py").module.parse_args(["--smoke", "tiny", "--memory", "none"])
    assert args.memory == "none"
