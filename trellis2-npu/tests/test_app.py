"""trellis2-npu/app.py in a real browser (needs TRELLIS2_SRC): the tiny models served, the default image made into
an asset, the GLB in the 3D viewer, its QA panel shows report.json's figures and the downloads are the files the app
wrote; an RGB photo on the smoke models is a message on the page, and with "Use the image whole" ticked it is made
into an asset; start-up failures are inference.py's errors and exit codes."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import trimesh
from PIL import Image

from deliverykit import testing
from deliverykit.errors import ExitCode
from deliverykit.testing import (
    assert_refused_before_serving,
    headless_chromium,
    save_screenshot,
    start_app_until_exit,
)
from trellis2_npu import generate, page, rembg
from trellis2_npu.tiny import tiny_image, tiny_mesh

from .conftest import START_UP_REFUSALS

gr = pytest.importorskip("gradio", reason="gradio is not installed: pip install -r trellis2-npu/requirements-app.txt")
APP = Path(__file__).resolve().parents[1] / "app.py"


@pytest.mark.parametrize(("argv", "code", "says"), [((), ExitCode.USAGE, "pass --weights DIR"), *START_UP_REFUSALS])
def test_start_up_fails_before_serving_like_inference(tmp_path, request, argv, code, says):
    if "UPSTREAM" in argv:  # only these cases get as far as the checkout (TRELLIS2_SRC); the others run everywhere
        argv = [str(request.getfixturevalue("patched")) if arg == "UPSTREAM" else arg for arg in argv]
    done = start_app_until_exit(APP, *argv, "--output", tmp_path / "out")
    assert_refused_before_serving(done, code, says, tmp_path / "out")


def test_start_up_without_an_upstream_checkout_is_exit_3(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRELLIS2_SRC"}
    done = start_app_until_exit(APP, "--smoke", "--output", tmp_path / "out", env=env)
    assert_refused_before_serving(done, ExitCode.INPUT, "TRELLIS2_SRC", tmp_path / "out")


TEXTURE, FRAMES = 64, 4  # tiny texture and turntable: the request's files, not their quality


@pytest.fixture(scope="module")
def textures(patched):
    """The "Texture a mesh" tab's pipeline on the tiny models, loaded once as app.py loads it."""
    import torch

    from trellis2_npu.session import Checked, TexturingSession

    args = argparse.Namespace(smoke="tiny", weights=None, texture_size=TEXTURE, preview_frames=FRAMES, steps=2)
    with contextlib.ExitStack() as stack:
        yield TexturingSession.load(args, stack, torch.device("cpu"), Checked(patched, []), generate.SMOKE_RESOLUTION)


@pytest.fixture(scope="module")
def uploads(tmp_path_factory) -> dict[str, Path]:
    """Files a user could upload: the tiny mesh (OBJ), the tiny RGBA image, an RGB photo and bad meshes."""
    folder = tmp_path_factory.mktemp("uploads")
    files = {name: folder / name for name in ("mesh.obj", "object.png", "photo.jpg", "broken.glb", "points.ply")}
    tiny_mesh().export(files["mesh.obj"])
    tiny_image().save(files["object.png"])
    Image.new("RGB", (64, 64), (90, 140, 200)).save(files["photo.jpg"])
    files["broken.glb"].write_text("not a glb")
    trimesh.PointCloud(np.random.default_rng(0).random((10, 3))).export(files["points.ply"])
    return files


def test_texture_request_writes_the_mesh_textured(textures, uploads, tmp_path):
    """A smoke request through the tab's function: one new folder with the five files, and a PBR-textured GLB whose
    faces are the uploaded mesh's faces (the texturing export keeps the mesh; its vertices normalised into the unit
    box as upstream does, float32 in the GLB: 1e-6)."""
    out = tmp_path / "out"
    upload = page.TextureUpload(str(uploads["mesh.obj"]), str(uploads["object.png"]), generate.SMOKE_RESOLUTION,
                                TEXTURE, steps=2, seed=7)  # fmt: skip
    files, stats = page.texture_request(textures, out, upload)
    (folder,) = out.iterdir()
    names = ["asset.glb", "preview.mp4", "preview.png", "report.json", "voxels.safetensors"]
    assert sorted(p.name for p in folder.iterdir()) == names and set(files) == set(names) - {"report.json"}
    report = json.loads((folder / "report.json").read_text())
    assert report["inputs"]["mesh"] == "mesh.obj" and report["inputs"]["seed"] == 7
    assert report["results"]["resolution"] == generate.SMOKE_RESOLUTION
    assert report["results"]["glb"].items() >= stats.items()  # what the tab's QA panel shows is what the report says
    glb = trimesh.load(files["asset.glb"], force="mesh", process=False)
    assert glb.visual.material.baseColorTexture.size == (TEXTURE, TEXTURE)
    source = tiny_mesh()
    low, high = source.vertices.min(axis=0), source.vertices.max(axis=0)
    normalised = (source.vertices - (low + high) / 2) * (0.99999 / (high - low).max())
    distance = np.linalg.norm(glb.vertices[:, None] - normalised[None], axis=2)
    assert distance.min(axis=1).max() < 1e-6
    nearest = distance.argmin(axis=1)
    assert sorted(map(sorted, nearest[glb.faces].tolist())) == sorted(map(sorted, source.faces.tolist()))


def test_bad_texturing_uploads_are_one_line_and_write_nothing(textures, uploads, tmp_path, run_cli):
    """Each refusal is one line, before any work, with nothing under --output; a mesh the CLI refuses gets the
    CLI's own line, and an RGB photo with no background-removal model the CLI's line naming the page's checkbox."""
    from deliverykit.app import shown_on_page
    from deliverykit.errors import DeliveryError

    out, no_rembg = tmp_path / "out", rembg.no_model_message(None)
    mesh, picture = str(uploads["mesh.obj"]), str(uploads["object.png"])
    cases = [
        ((None, picture), {}, page.NO_MESH),
        ((mesh, None), {}, page.NO_IMAGE),
        ((str(uploads["broken.glb"]), picture), {}, "cannot read"),
        ((str(uploads["points.ply"]), picture), {}, "has no faces"),
        ((mesh, str(tmp_path / "gone.png")), {}, "does not exist"),
        ((mesh, str(uploads["photo.jpg"])), {"rembg_unavailable": no_rembg}, page.WHOLE_IMAGE),
    ]
    for (mesh_path, image_path), extra, says in cases:
        with pytest.raises(DeliveryError) as refused:
            upload = page.TextureUpload(mesh_path, image_path, generate.SMOKE_RESOLUTION, TEXTURE, 2, 7)
            page.texture_request(textures, out, upload, **extra)
        message = str(refused.value)
        assert says in message and "\n" not in message, message
        assert not out.exists(), f"{says}: the refused request wrote {list(out.rglob('*'))}"
        if "cannot read" in says or "has no faces" in says or extra:  # the CLI's own line for the same files
            _, _, err = run_cli("--smoke", "tiny", "--device", "cpu", "--upstream", textures.checkout,
                                "--mesh", mesh_path, "--image", image_path, "--output", tmp_path / "cli")  # fmt: skip
            cli = err.strip().splitlines()[-1]
            assert cli == f"error: {message.replace(page.WHOLE_IMAGE, '--no-rembg')}", (cli, message)
    with pytest.raises(gr.Error, match=re.escape(f"error: {page.NO_MESH}")):  # as the page shows it
        upload = page.TextureUpload(None, picture, generate.SMOKE_RESOLUTION, TEXTURE, 2, 7)
        shown_on_page(page.texture_request)(textures, out, upload)
    assert not out.exists()


def test_qa_panel_shows_the_exports_figures_and_na_for_missing_ones():
    """Both tabs' panel: the GLB's faces (not mesh_qa's, counted before the UV unwrap), the face budget, mesh_qa's
    checks and the texture coverage; a figure the export did not give (texturing has no face budget, a genus needs a
    closed surface, stats without mesh_qa) is "n/a", not an error."""
    quality = {"faces": 990, "boundary_edges": 0, "non_manifold_edges": 2, "components": 3, "watertight": False,
               "consistently_wound": True, "genus": None}  # fmt: skip
    atlas = {"texel_coverage": 0.4567, "charts": 120, "small_chart_share": 0.25, "texels_per_unit": 1234.56}
    image_to_3d = {"faces": 987, "decimation_target": 1000, **atlas, "mesh_qa": quality}
    rows = dict(line.removeprefix("- ").split(": ") for line in page.qa_panel(image_to_3d).splitlines()[2:])
    assert rows == {
        "faces": "987",
        "budget (--faces)": "1000",
        "boundary edges": "0",
        "non-manifold edges": "2",
        "components": "3",
        "watertight": "no",
        "consistently wound": "yes",
        "genus": "n/a",
        "texture coverage": "45.7 %",
        "charts": "120",
        "charts under 8 texels": "25.0 %",
        "texel density (per unit)": "1235",
    }
    texturing = {"faces": 12, "texel_coverage": 1.0, "mesh_qa": {**quality, "watertight": True, "genus": 0}}
    panel = page.qa_panel(texturing)
    assert "- budget (--faces): n/a\n" in panel and "- genus: 0\n" in panel and "- watertight: yes\n" in panel
    assert page.qa_panel({}).count(": n/a") == len(page.QA_ROWS)


def test_no_texturing_pipeline_json_is_a_message_on_the_tab(tmp_path):
    """A TRELLIS.2-4B folder without texturing_pipeline.json still serves image → 3D; the tab's requests get the
    message naming the download (the one inference.py --mesh exits 4 with), writing nothing."""
    from deliverykit.errors import WeightsError

    weights, out = tmp_path / "TRELLIS.2-4B", tmp_path / "out"
    weights.mkdir()
    (weights / "pipeline.json").write_text("{}")
    why = page.texturing_unavailable(weights)
    assert "has no texturing_pipeline.json" in why and "--all-files" in why
    with pytest.raises(WeightsError, match=r"has no texturing_pipeline\.json"):
        page.texture_request(
            None, out, page.TextureUpload("mesh.obj", "object.png", 1024, 2048, 12, 42), unavailable=why
        )
    assert not out.exists()
    (weights / "texturing_pipeline.json").write_text("{}")
    assert page.texturing_unavailable(weights) is None


@pytest.fixture(scope="module")
def served(tmp_path_factory, patched):
    """The app on the tiny models (both pipelines), one headless browser on its page: ``(browser, output,
    folder)``, shared by the browser tests (one start-up)."""
    browser = headless_chromium(height=900)  # skips without selenium, chromium or chromedriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    tmp = tmp_path_factory.mktemp("app")
    out = tmp / "out"
    command = [sys.executable, str(APP), "--smoke", "--upstream", str(patched), "--device", "cpu"]
    # the page's flow; the remesh costs ~25 s here and a 2048² bake ~15 s (the page's own default sizes)
    command += ["--port", "0", "--output", str(out), "--no-remesh", "--texture-size", "512"]
    try:
        with testing.served(command, env={"GRADIO_TEMP_DIR": str(tmp / "gradio")}) as app:
            url, log = app.url, app.lines
            browser.get(url)
            WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#generate"))
            yield browser, out, tmp
            assert not [line for line in log if "Traceback" in line]
    finally:
        browser.quit()


def _folders(out: Path) -> set[Path]:
    return set(out.iterdir()) if out.exists() else set()


def _served_files(links) -> dict[str, bytes]:
    return {Path(a.get_attribute("href")).name: urllib.request.urlopen(a.get_attribute("href")).read() for a in links}


def _assert_qa_panel_shows(browser, selector: str, folder: Path) -> None:
    """The QA panel beside the GLB shows the face count and the texture coverage the request's report.json records."""
    from selenium.webdriver.common.by import By

    glb = json.loads((folder / "report.json").read_text())["results"]["glb"]
    text = browser.find_element(By.CSS_SELECTOR, selector).text
    assert re.search(rf"(?m)^faces: {glb['faces']}$", text), text
    assert re.search(rf"(?m)^texture coverage: {100 * glb['texel_coverage']:.1f} %$", text), text


def test_browser_makes_an_asset_and_refuses_an_rgb_photo(served):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser, out, tmp_path = served
    browser.find_element(By.CSS_SELECTOR, "#image-to-3d-button").click()
    before = _folders(out)
    browser.find_element(By.CSS_SELECTOR, "#generate").click()
    links = WebDriverWait(browser, 600).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#files a"))
    (folder,) = _folders(out) - before
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["asset.glb", "mesh.ply", "preview.mp4", "preview.png", "report.json", "voxels.safetensors"]
    )
    served_files = _served_files(links)
    assert served_files == {name: (folder / name).read_bytes() for name in ("asset.glb", "mesh.ply")}
    assert served_files["asset.glb"][:4] == b"glTF"
    _assert_qa_panel_shows(browser, "#qa", folder)
    assert not browser.find_element(By.CSS_SELECTOR, "#remesh input").is_selected()  # --no-remesh: the default
    assert browser.find_elements(By.CSS_SELECTOR, "#model canvas")  # the 3D viewer holds the GLB
    assert browser.find_elements(By.CSS_SELECTOR, "#video video")  # and the player the turntable
    time.sleep(2)  # let the viewer draw the GLB before the picture is taken (nothing is timed here)
    save_screenshot(browser, tmp_path, "trellis2-npu-app.png")

    photo = tmp_path / "photo.jpg"
    Image.new("RGB", (64, 64), (90, 140, 200)).save(photo)
    browser.find_element(By.CSS_SELECTOR, "#image button[aria-label='Remove Image']").click()
    browser.find_element(By.CSS_SELECTOR, "#image input[type=file]").send_keys(str(photo))
    browser.find_element(By.CSS_SELECTOR, "#generate").click()
    WebDriverWait(browser, 60).until(lambda b: "error: " in b.find_element(By.TAG_NAME, "body").text)
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "the image has no alpha channel" in page and '"Use the image whole" (--no-rembg)' in page
    assert _folders(out) - before == {folder}  # the refused request wrote nothing

    browser.find_element(By.CSS_SELECTOR, "#whole input[type=checkbox]").click()  # --no-rembg on the page
    browser.find_element(By.CSS_SELECTOR, "#generate").click()
    WebDriverWait(browser, 600).until(lambda b: len(_folders(out) - before) == 2)
    (whole,) = _folders(out) - before - {folder}
    six = sorted(["asset.glb", "mesh.ply", "preview.mp4", "preview.png", "report.json", "voxels.safetensors"])
    WebDriverWait(browser, 60).until(lambda b: sorted(p.name for p in whole.iterdir()) == six)


def test_browser_textures_the_built_in_mesh_and_refuses_no_mesh(served):
    """The second tab on the smoke models: the tiny mesh and image it starts with textured into one folder, the GLB
    served is the file written and keeps the mesh's faces; a cleared mesh is a message and writes nothing."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser, out, tmp_path = served
    browser.execute_script("window.scrollTo(0, 0)")  # the first tab's outputs scroll the tabs out of reach of a click
    browser.find_element(By.CSS_SELECTOR, "#texture-a-mesh-button").click()
    button = WebDriverWait(browser, 30).until(lambda b: b.find_element(By.CSS_SELECTOR, "#tex-generate"))
    before = _folders(out)
    button.click()
    links = WebDriverWait(browser, 600).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#tex-files a"))
    (folder,) = _folders(out) - before
    five = ["asset.glb", "preview.mp4", "preview.png", "report.json", "voxels.safetensors"]
    assert sorted(p.name for p in folder.iterdir()) == five
    served_files = _served_files(links)
    assert served_files == {"asset.glb": (folder / "asset.glb").read_bytes()}
    glb = trimesh.load(io.BytesIO(served_files["asset.glb"]), file_type="glb", force="mesh", process=False)
    assert len(glb.faces) == len(tiny_mesh().faces)
    _assert_qa_panel_shows(browser, "#tex-qa", folder)
    assert browser.find_elements(By.CSS_SELECTOR, "#tex-model canvas")
    assert browser.find_elements(By.CSS_SELECTOR, "#tex-video video")
    time.sleep(2)  # let the viewer draw the GLB before the picture is taken (nothing is timed here)
    save_screenshot(browser, tmp_path, "trellis2-npu-app-texturing.png")

    browser.find_element(By.CSS_SELECTOR, "#tex-mesh button[aria-label='Clear']").click()
    button.click()
    WebDriverWait(browser, 60).until(lambda b: "error: no mesh" in b.find_element(By.TAG_NAME, "body").text)
    assert f"error: {page.NO_MESH}" in browser.find_element(By.TAG_NAME, "body").text
    assert _folders(out) - before == {folder}
