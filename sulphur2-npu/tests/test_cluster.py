"""sulphur2-npu/inference.py --batch --ray on a local two-node Ray cluster (127.0.0.1): the same videos as one
--batch process, frames equal up to rounding. The queue, node and driver failures are tested on a stand-in in
``shared/tests/test_cluster.py``."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from deliverykit.testing import assert_images_equal_up_to_rounding, check_ray_batch

pytest.importorskip("ray", reason="ray is missing: pip install -r sulphur2-npu/requirements-app.txt")
INFERENCE = Path(__file__).resolve().parents[1] / "inference.py"
pytestmark = pytest.mark.heavy


def same_video(one: Path, ray: Path) -> None:
    """The first and last frames (PNG, straight from the float video) equal up to rounding, and as many frames in the
    mp4; the mp4's bytes are not compared: x264 turns a one-level change into other motion choices."""
    for suffix in ("_first.png", "_last.png"):
        pictures = [np.asarray(Image.open(folder / f"{folder.name}{suffix}")) for folder in (one, ray)]
        assert_images_equal_up_to_rounding(*pictures, what=f"{ray.name}{suffix}")
    counts = []
    for folder in (one, ray):
        with av.open(str(folder / f"{folder.name}.mp4")) as container:
            counts.append(sum(1 for _ in container.decode(video=0)))
    assert counts[0] == counts[1] == 9


def test_a_batch_over_two_ray_nodes_equals_one_process(tmp_path):
    lines = [{"prompt": "a red fox", "seed": 1}, {"prompt": "a cat", "seed": 2}, {"prompt": "a dog", "seed": 3}]
    check_ray_batch([INFERENCE, "--smoke", "--device", "cpu"], lines, tmp_path, same_video)
