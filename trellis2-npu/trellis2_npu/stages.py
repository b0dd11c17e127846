"""Named stages inside upstream's calls, timed by whoever runs the pipeline.

Upstream's pipelines call our hooks (mesh extraction, voxelisation) and the per-stage model loads of
:mod:`.offload` deep inside ``run()``; :func:`timed` reports each to the run's timer (``Stopwatch.stage``) set by
:mod:`.generate` or :mod:`.texturing`, and does nothing when none is set. A module of its own so that both the hooks
and the loader's offload can use it without importing each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

_stage_timer: Callable[[str], contextlib.AbstractContextManager] | None = None


def set_stage_timer(timer: Callable[[str], contextlib.AbstractContextManager] | None) -> None:
    """Route :func:`timed` stages to ``timer`` (e.g. ``Stopwatch.stage``); None turns timing off."""
    global _stage_timer
    _stage_timer = timer


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:
    if _stage_timer is None:
        yield
    else:
        with _stage_timer(name):
            yield
