"""The collector policy (kittiwake.collector): the heap is frozen as the broker's long-lived
structures grow, by steps, and never again for churn below the high-water mark."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kittiwake.collector import STEP, CollectorPolicy


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Leave the test process's collector as it was (nothing frozen by these tests)."""
    before = gc.get_freeze_count()
    yield
    gc.unfreeze()
    if before:
        gc.freeze()


class Tracked:
    """A long-lived object the collector tracks (an instance of a Python class)."""


def test_growth_by_a_step_freezes_what_exists(unfrozen: None) -> None:
    size = [0]
    policy = CollectorPolicy(lambda: size[0])
    kept = [Tracked() for _ in range(100)]
    size[0] = STEP - 1
    policy.check()
    assert policy.freezes == 0
    size[0] = STEP
    policy.check()
    assert policy.freezes == 1
    # What existed is out of the collector's generations, so a full pass never walks it.
    assert not any(gc.is_tracked(k) and _in_generations(k) for k in kept)


def test_churn_below_the_high_water_mark_never_freezes_again(unfrozen: None) -> None:
    size = [STEP]
    policy = CollectorPolicy(lambda: size[0])
    policy.check()
    assert policy.freezes == 1
    for _ in range(1000):  # subscribe and unsubscribe the same 40,000 over and over
        size[0] = STEP - 40_000
        policy.check()
        size[0] = STEP + STEP - 1
        policy.check()
    assert policy.freezes == 1


def test_freezes_grow_with_the_logarithm_of_the_size(unfrozen: None) -> None:
    size = [0]
    policy = CollectorPolicy(lambda: size[0])
    for size[0] in range(0, 10_000_001, 1000):
        policy.check()
    # Steps of STEP to 500,000 (10), then of a tenth (31 more): 41 freezes for ten million.
    assert policy.freezes == 41


def _in_generations(obj: object) -> bool:
    return any(o is obj for generation in range(3) for o in gc.get_objects(generation))
