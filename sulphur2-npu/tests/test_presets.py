"""Presets: valid sizes, ordered cost, overrides applied one by one."""

from __future__ import annotations

import pytest

from sulphur2_npu.presets import DEFAULT_PRESET, PRESETS, Preset, resolve_preset
from sulphur2_npu.sizes import validate_size


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_size_the_vae_can_make(name):
    preset = PRESETS[name]
    assert preset.width % 32 == 0 and preset.height % 32 == 0 and (preset.num_frames - 1) % 8 == 0
    validate_size(preset.width, preset.height, preset.num_frames)
    assert preset.steps >= 1 and preset.guidance > 1  # the dev weights need guidance


def test_presets_grow_in_cost_and_the_default_is_one_of_them():
    assert list(PRESETS) == ["mini", "balanced", "quality"] and DEFAULT_PRESET in PRESETS

    def cost(p: Preset) -> int:  # transformer work ~ latent tokens x steps
        return (p.width // 32) * (p.height // 32) * ((p.num_frames - 1) // 8 + 1) * p.steps

    costs = [cost(p) for p in PRESETS.values()]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)


def test_balanced_is_the_ltx23_stage1_size():
    p = PRESETS["balanced"]
    assert (p.width, p.height, p.num_frames) == (768, 512, 121)  # ltx-pipelines PipelineParams defaults


def test_overrides_replace_only_the_given_fields():
    base = PRESETS["mini"]
    got = resolve_preset("mini", width=640, steps=None, guidance=1.0)
    assert got == Preset(640, base.height, base.num_frames, base.steps, 1.0)
    assert resolve_preset(base) == base
    assert PRESETS["mini"] == base  # the table itself is unchanged


def test_unknown_preset_or_field_is_rejected():
    with pytest.raises(ValueError, match="expected one of mini, balanced, quality"):
        resolve_preset("huge")
    with pytest.raises(TypeError, match="fps"):
        resolve_preset("mini", fps=30)
