"""deliverykit.memory: resident-set sampling and peak growth around a call (the benchmarks' memory figures)."""

from __future__ import annotations

import mmap
import os

import pytest

from deliverykit import memory


def _touch_anonymous(size: int) -> mmap.mmap:
    """``size`` bytes of private anonymous memory straight from the kernel, every page written.

    Fresh pages every call: a tensor from the allocator can be served from pages the process already holds (in a
    pytest-xdist worker of a fresh-clone CI run, ``torch.ones`` of 48 MiB grew RssAnon by 4 KiB, and one of 64 MiB
    grew RSS by less than 32 MiB), and a shared mapping would count as RssShmem instead of RssAnon.
    """
    block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, size, 4096):
        block[offset] = 1
    return block


def test_peak_memory_growth_on_cpu_sees_a_large_allocation():
    size = 64 * 2**20
    block, growth, method = memory.peak_memory_growth(lambda: _touch_anonymous(size), "cpu")
    with block:
        assert len(block) == size and method == "RSS growth (sampled)"
        assert growth is None or growth >= size // 2  # None only where /proc is missing


def test_resident_memory_adds_up():
    resident = memory.resident_memory()
    if resident is None:
        pytest.skip("no /proc/self/status here")
    assert resident["anon"] > 0 and resident["file"] > 0  # the interpreter's heap and its mapped libraries
    assert resident["rss"] >= resident["anon"] + resident["file"]  # VmRSS also counts shared memory (RssShmem)
    assert resident["rss_peak"] >= resident["rss"]


def test_peak_resident_growth_tells_heap_from_mapped_file(tmp_path):
    if memory.resident_memory() is None:
        pytest.skip("no /proc/self/status here")
    size = 48 * 2**20
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(size))

    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        # touch every page, copy nothing; the mapping stays open until the last sample
        _, mapped_growth = memory.peak_resident_growth(lambda: sum(mapped[i] for i in range(0, size, 4096)))
    assert mapped_growth["file"] >= size // 2 and mapped_growth["anon"] < size // 4

    block, heap_growth = memory.peak_resident_growth(lambda: _touch_anonymous(size))  # kept alive until checked
    with block:
        assert heap_growth["anon"] >= size // 2 and heap_growth["file"] < size // 4
        assert heap_growth["rss"] >= heap_growth["anon"]
