"""Fixtures for the sulphur2-npu tests: the tiny LTX-2.3 model, its smoke files and the CLI run in process.

``sulphur2_npu`` is the installed package (``make`` installs it editable), as ``python inference.py`` sees it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from deliverykit.device import guard_cpu_kernels
from deliverykit.testing import CliRunner, ignore_tests_below_python

DELIVERY_DIR = Path(__file__).resolve().parents[1]
guard_cpu_kernels()  # in-process CPU runs under a forced ATEN_CPU_CAPABILITY (see its docstring)
collect_ignore_glob = ignore_tests_below_python((3, 11), "sulphur2-npu needs Python >= 3.11 (diffusers 0.42.1)")


@pytest.fixture(scope="session")
def tiny_components() -> dict[str, Any]:
    """The tiny LTX-2.3 components, seed 0 (sulphur2_npu.tiny). Shared by the session: do not modify."""
    from sulphur2_npu.tiny import tiny_components as build

    return build(seed=0)


@pytest.fixture(scope="session")
def ltx_core_distilled_sigmas() -> list[float]:
    """ltx-pipelines ``utils/constants.py:DISTILLED_SIGMA_VALUES`` at Lightricks/LTX-2 400fd310, copied by hand."""
    return [1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0]


@pytest.fixture(scope="session")
def ltx2_scheduler_sigmas():
    """ltx-core ``components/schedulers.py:LTX2Scheduler.execute`` at 400fd310, rewritten in float64 from its source.

    ``tokens=None`` is what ltx-pipelines' one- and two-stage pipelines do (no ``latent=``: the 4096 default).
    """

    def execute(steps: int, tokens: int | None = None, max_shift=2.05, base_shift=0.95, terminal=0.1) -> list[float]:
        tokens = 4096 if tokens is None else tokens
        slope = (max_shift - base_shift) / (4096 - 1024)
        shift = tokens * slope + base_shift - slope * 1024
        sigmas = [1.0 - i / steps for i in range(steps)]  # linspace(1, 0, steps + 1) without its 0
        shifted = [math.exp(shift) / (math.exp(shift) + (1 / s - 1)) for s in sigmas]
        scale = (1.0 - shifted[-1]) / (1.0 - terminal)  # stretch: the last non-zero sigma becomes `terminal`
        return [1.0 - (1.0 - s) / scale for s in shifted] + [0.0]

    return execute


@pytest.fixture(scope="session")
def smoke_files(tmp_path_factory):
    """Tiny single file with the ltx-core metadata config + Gemma folder (tokenizer beside it), seed 0. Read only."""
    from sulphur2_npu.tiny import write_smoke_files

    return write_smoke_files(tmp_path_factory.mktemp("sulphur2-smoke"), seed=0)


@pytest.fixture(scope="session")
def smoke_files_without_metadata(tmp_path_factory):
    """Like ``smoke_files`` but no ``__metadata__`` config (configs come from shapes), tokenizer in tokenizer/."""
    from sulphur2_npu.tiny import write_smoke_files

    folder = tmp_path_factory.mktemp("sulphur2-smoke-shapes")
    return write_smoke_files(folder, seed=0, with_metadata=False, tokenizer_subfolder=True)


@pytest.fixture(scope="session")
def smoke_files_partial_metadata(tmp_path_factory):
    """Like ``smoke_files`` but the metadata config lacks the transformer, vae and audio_vae sections (the transformer
    section also holds the connectors'): those configs come from shapes and ltx-core's defaults."""
    from sulphur2_npu.tiny import write_smoke_files

    folder = tmp_path_factory.mktemp("sulphur2-smoke-partial")
    return write_smoke_files(folder, seed=0, omit_sections=("transformer", "vae", "audio_vae"))


@pytest.fixture(scope="session")
def as_ltx20():
    """Turn LTX-2.3 key names into the LTX-2.0 layout: no gated attention, prompt AdaLN or BWE, one projection."""
    only23 = ("to_gate_logits", "prompt_adaln_single", "prompt_scale_shift_table", "bwe_generator", "mel_stft")

    def convert(keys: list[str]) -> list[str]:
        kept = [key for key in keys if not any(name in key for name in only23) and "audio_aggregate_embed" not in key]
        renamed = [key.replace("video_aggregate_embed", "aggregate_embed") for key in kept]
        return [*renamed, "model.diffusion_model.caption_projection.linear_1.weight"]

    return convert


@pytest.fixture(scope="session")
def run_cli() -> CliRunner:
    """``sulphur2-npu/inference.py`` run in process like ``python inference.py ARGS``: (exit code, stdout, stderr).

    Session-scoped (output captured with redirects, not capsys) so that module fixtures can share one smoke run.
    """
    return CliRunner(DELIVERY_DIR / "inference.py", "sulphur2_inference")
