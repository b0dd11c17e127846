"""ursa-npu/inference.py --batch --ray on a local two-node Ray cluster (127.0.0.1): the same images as one --batch
process (up to rounding) (needs ``$URSA_SRC``). The queue, node and driver failures are tested on a stand-in in
``shared/tests/test_cluster.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from deliverykit.testing import assert_jpegs_equal_up_to_rounding, check_ray_batch

pytest.importorskip("ray", reason="ray is missing: pip install -r ursa-npu/requirements-app.txt")
INFERENCE = Path(__file__).resolve().parents[1] / "inference.py"
pytestmark = pytest.mark.heavy


def test_a_batch_over_two_ray_nodes_equals_one_process(tmp_path, patched_upstream):
    lines = [{"prompt": "a red fox", "seed": 1}, {"prompt": "a cat", "seed": 2}, {"prompt": "a dog", "seed": 3}]
    command = [INFERENCE, "--smoke", "--upstream", patched_upstream, "--device", "cpu"]
    check_ray_batch(command, lines, tmp_path, same_jpeg)


def same_jpeg(one: Path, ray: Path) -> None:
    pictures = [(folder / f"{folder.name}.jpg").read_bytes() for folder in (one, ray)]
    assert_jpegs_equal_up_to_rounding(*pictures, what=ray.name)
