"""The BFC allocator replay (`lms.sim.bfc`): best fit over every free chunk, its bins kept in order."""

from __future__ import annotations

import random

import pytest

from lms.sim.bfc import BFCAllocator


def _free_entries(bfc: BFCAllocator) -> list[tuple[int, int, int]]:
    return [e for entries in bfc.bins for e in entries]


@pytest.mark.parametrize("seed", range(6))
def test_each_allocation_takes_the_best_fitting_free_chunk_as_a_full_search_would(seed: int) -> None:
    rng = random.Random(seed)
    bfc = BFCAllocator()
    held: list[int] = []
    checked = 0
    for _ in range(3000):
        if held and rng.random() < 0.45:
            bfc.free(held.pop(rng.randrange(len(held))))
        else:
            nbytes = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 1 << 20), rng.randrange(1, 64 << 20)])
            rounded = max(256, -(-nbytes // 256) * 256)
            fitting = [e for e in _free_entries(bfc) if e[0] >= rounded]
            chunk = bfc.allocate(nbytes)
            if fitting:  # the smallest free chunk that fits, then the lowest address (TF's bins, searched whole)
                size, ptr, best = min(fitting)
                assert (chunk, bfc.ptr[chunk]) == (best, ptr)
                checked += 1
            assert bfc.used[chunk] and bfc.size[chunk] >= rounded
            held.append(chunk)
        # every free chunk is binned by its size, in (size, address) order; the non-empty mask says which bins
        for b, entries in enumerate(bfc.bins):
            assert entries == sorted(entries)
            assert all(min((s >> 8).bit_length() - 1, 20) == b and not bfc.used[c] for s, _, c in entries)
            assert bool(bfc._nonempty >> b & 1) == bool(entries)  # noqa: SLF001
        assert bfc.in_use == sum(bfc.size[c] for c in held) and bfc.peak >= bfc.in_use
    assert checked > 500
