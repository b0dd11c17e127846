"""sulphur2-npu/inference.py --batch --ray on a local two-node Ray cluster (127.0.0.1): the same videos as one --batch
process, frames equal up to rounding; serve.py --ray answering the official client. The queue, node and driver
failures are tested on a stand-in in ``shared/tests/test_cluster.py``."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from deliverykit.testing import assert_images_equal_up_to_rounding, check_ray_batch, local_ray_cluster, served

pytest.importorskip("ray", reason="ray is missing: pip install -r sulphur2-npu/requirements-app.txt")
INFERENCE = Path(__file__).resolve().parents[1] / "inference.py"
SERVE = INFERENCE.with_name("serve.py")
pytestmark = [pytest.mark.heavy, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]


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


def test_serve_over_a_ray_cluster_answers_the_openai_client(tmp_path):
    """``serve.py --ray auto`` (the cluster named by ``RAY_ADDRESS``, as on a host that ran ``ray start``): no model
    in the server, one actor per node makes the videos, the official client gets them."""
    openai = pytest.importorskip(
        "openai", reason="the openai client is missing: pip install -r ci/requirements-dev.txt"
    )
    command = [sys.executable, SERVE, "--smoke", "--device", "cpu", "--port", 0, "--jobs", tmp_path, "--ray", "auto"]
    with local_ray_cluster(2) as cluster, served(command, env={"RAY_ADDRESS": cluster.address}) as server:
        client = openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)
        videos = [client.videos.create(prompt="a red fox", extra_body={"seed": seed}) for seed in (1, 2)]
        for video in videos:
            deadline = time.monotonic() + 300
            while (video := client.videos.retrieve(video.id)).status in ("queued", "in_progress"):
                assert time.monotonic() < deadline, video
                time.sleep(0.2)
            assert video.status == "completed", video
            mp4 = client.videos.download_content(video.id).read()
            with av.open(io.BytesIO(mp4)) as container:
                assert sum(1 for _ in container.decode(video=0)) == 9
        assert server.stop() == 0
    assert "ray: 2 workers" in server.output
