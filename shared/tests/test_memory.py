"""deliverykit.memory: resident-set sampling and peak growth around a call (the benchmarks' memory figures)."""

from __future__ import annotations

import os

import pytest
import torch

from deliverykit import memory


def test_peak_memory_growth_on_cpu_sees_a_large_allocation():
    def allocate():
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        return float(block.sum())

    result, growth, method = memory.peak_memory_growth(allocate, "cpu")
    assert result == 64 * 2**20 // 4 and method == "RSS growth (sampled)"
    assert growth is None or growth >= 32 * 2**20  # None only where /proc is missing


def test_resident_memory_adds_up():
    resident = memory.resident_memory()
    if resident is None:
        pytest.skip("no /proc/self/status here")
    assert resident["anon"] > 0 and resident["file"] > 0  # the interpreter's heap and its mapped libraries
    assert resident["rss"] >= resident["anon"] + resident["file"]  # VmRSS also counts shared memory (RssShmem)
    assert resident["rss_peak"] >= resident["rss"]


def test_peak_resident_growth_tells_heap_from_mapped_file(tmp_path):
    import mmap

    if memory.resident_memory() is None:
        pytest.skip("no /proc/self/status here")
    size = 48 * 2**20
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(size))

    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        # touch every page, copy nothing; the mapping stays open until the last sample
        _, mapped_growth = memory.peak_resident_growth(lambda: sum(mapped[i] for i in range(0, size, 4096)))
    assert mapped_growth["file"] >= size // 2 and mapped_growth["anon"] < size // 4

    # private anonymous memory straight from the kernel (a shared one counts as RssShmem), every page written, kept
    # alive: a tensor from the allocator can be served from pages the process already holds (torch.ones grew anon by
    # 4 KiB once, in a pytest-xdist worker of a fresh-clone CI run)
    def touch_anonymous() -> mmap.mmap:
        block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for offset in range(0, size, 4096):
            block[offset] = 1
        return block

    block, heap_growth = memory.peak_resident_growth(touch_anonymous)
    with block:
        assert heap_growth["anon"] >= size // 2 and heap_growth["file"] < size // 4
        assert heap_growth["rss"] >= heap_growth["anon"]
