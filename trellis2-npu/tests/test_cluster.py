"""trellis2-npu/inference.py --batch --ray on a local two-node Ray cluster (127.0.0.1): the same assets as one
--batch process (their voxels) (needs ``$TRELLIS2_SRC``). The queue, node and driver failures are tested on a stand-in
in ``shared/tests/test_cluster.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from deliverykit.testing import check_ray_batch

pytest.importorskip("ray", reason="ray is missing: pip install -r trellis2-npu/requirements-app.txt")
INFERENCE = Path(__file__).resolve().parents[1] / "inference.py"
pytestmark = pytest.mark.heavy


def test_a_batch_over_two_ray_nodes_equals_one_process(tmp_path, patched):
    """Two tiny assets with the fast export settings of the browser test; their voxels compared."""
    command = [INFERENCE, "--smoke", "tiny", "--upstream", patched, "--device", "cpu", "--no-remesh"]
    command += ["--texture-size", "64", "--preview-frames", "0"]
    check_ray_batch(command, [{"seed": 1}, {"seed": 2}], tmp_path, same_voxels)


def same_voxels(one: Path, ray: Path) -> None:
    """The decoded voxels (``voxels.safetensors``) of the same maths in two processes: the random-weight occupancy sits
    near its threshold in many places, where a float reordering flips a voxel, so the two sets overlap almost
    entirely (intersection over union >= 0.99) rather than exactly."""
    keys = []
    for folder in (one, ray):
        coords = next(t for t in load_file(folder / "voxels.safetensors").values() if not t.is_floating_point())
        keys.append(np.unique(coords.long().numpy() @ (1 << np.arange(0, 21 * coords.shape[1], 21)[::-1])))
    shared = np.intersect1d(*keys, assume_unique=True).size
    assert shared / (keys[0].size + keys[1].size - shared) >= 0.99, (ray.name, keys[0].size, keys[1].size, shared)
