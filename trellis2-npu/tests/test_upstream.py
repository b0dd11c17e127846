"""Finding the patched checkout (``trellis2_npu.upstream``, via deliverykit.assets.patches): refusals name the fix."""

from __future__ import annotations

import pytest

from deliverykit.errors import DeliveryError
from trellis2_npu.upstream import find_patched_upstream


def test_missing_upstream_names_the_clone_command(tmp_path, monkeypatch):
    with pytest.raises(DeliveryError) as err:
        find_patched_upstream(tmp_path)
    assert "deliverykit upstream clone --delivery trellis2-npu" in str(err.value)
    assert err.value.exit_code == 3
    monkeypatch.delenv("TRELLIS2_SRC", raising=False)
    with pytest.raises(DeliveryError) as err:
        find_patched_upstream()
    assert "no --upstream, no $TRELLIS2_SRC" in str(err.value) and err.value.exit_code == 3
    monkeypatch.setenv("TRELLIS2_SRC", str(tmp_path))
    with pytest.raises(DeliveryError, match=r"\$TRELLIS2_SRC .* is not the upstream checkout"):
        find_patched_upstream()
