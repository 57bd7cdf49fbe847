"""Duration-balanced shards (pytest-split's least_duration) and the durations read from row files."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sweep.shard import ShardError, balanced_shards, durations_from_rows, shard_of

case_ids = st.lists(st.text(min_size=1, max_size=12), max_size=60, unique=True)
seconds = st.floats(min_value=0, max_value=1e5, allow_nan=False, allow_infinity=False)


@st.composite
def cases_with_durations(draw):
    """Ids, a duration for some of them (and for ids not among them), and a shard count."""
    ids = draw(case_ids)
    known = draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
    durations = {case_id: draw(seconds) for case_id in known}
    durations.update(draw(st.dictionaries(st.text(max_size=5), seconds, max_size=3)))  # not collected: ignored
    return ids, durations, draw(st.integers(1, 20))


@given(cases_with_durations())
def test_every_case_lands_in_exactly_one_shard(drawn):
    ids, durations, count = drawn
    shards = balanced_shards(ids, durations, count)
    assert sorted(shards) == sorted(ids)
    assert all(1 <= shard <= count for shard in shards.values())


@given(cases_with_durations(), st.randoms(use_true_random=False))
def test_assignment_does_not_depend_on_the_order_of_the_ids(drawn, rnd):
    ids, durations, count = drawn
    shuffled = list(ids)
    rnd.shuffle(shuffled)
    assert balanced_shards(shuffled, durations, count) == balanced_shards(ids, durations, count)
    assert balanced_shards(shuffled + shuffled[:3], durations, count) == balanced_shards(ids, durations, count)


# skewed: most cases take seconds, a few take minutes (as the sweep's timeouts do)
skewed = st.lists(st.one_of(st.floats(0, 5), st.floats(0, 60), st.floats(100, 600)), min_size=1, max_size=200)


@settings(max_examples=200)
@given(skewed, st.integers(1, 16))
def test_longest_shard_is_within_the_list_scheduling_bound(durations_list, count):
    durations = {f"M{i}-onnx-static": s for i, s in enumerate(durations_list)}
    shards = balanced_shards(durations, durations, count)
    loads = [0.0] * count
    for case_id, shard in shards.items():
        loads[shard - 1] += durations[case_id]
    mean = sum(durations_list) / count
    assert max(loads) <= mean + max(durations_list) + 1e-6


def test_balanced_split_beats_the_hash_split_on_a_skewed_catalog():
    rnd = random.Random(0)
    durations = {f"M{i}-executorch-dynamic": rnd.choice([1.0, 2.0, 30.0, 600.0]) * rnd.random() for i in range(400)}

    def longest(assign) -> float:
        loads = [0.0] * 8
        for case_id, seconds_ in durations.items():
            loads[assign(case_id) - 1] += seconds_
        return max(loads)

    balanced = balanced_shards(durations, durations, 8)
    mean = sum(durations.values()) / 8
    assert longest(balanced.__getitem__) <= 1.05 * mean < longest(lambda c: shard_of(c, 8))


def test_unknown_cases_count_as_the_mean_of_the_known_ones():
    # two known 10 s cases and two unknown (10 s each as the mean): two shards of two cases each
    shards = balanced_shards(["a", "b", "c", "d"], {"a": 10.0, "b": 10.0, "zz": 1000.0}, 2)
    assert sorted(list(shards.values())) == [1, 1, 2, 2]
    assert shards["a"] != shards["b"]
    assert balanced_shards([], {}, 3) == {}
    with pytest.raises(ShardError):
        balanced_shards(["a"], {}, 0)


def test_durations_come_from_the_latest_timed_row_of_each_case():
    rows = [
        {"case_id": "A-onnx-static", "wall_seconds": 5.0, "started": 1.0},
        {"case_id": "A-onnx-static", "wall_seconds": 7.0, "started": 2.0},  # later: wins
        {"model": "B", "backend": "eager", "shapes": "dynamic", "wall_seconds": 3, "started": 1.0},
        {"model": "C", "backend": "eager", "wall_seconds": 4.0, "started": 3.0},  # shapes default to static
        {"case_id": "C-eager-static", "wall_seconds": 9.0, "started": 2.0},  # earlier: loses
        {"case_id": "D-dynamo-static", "started": 1.0},  # no wall_seconds: no duration
        {"case_id": "E-dynamo-static", "wall_seconds": 2.0, "started": 1.0},
        {"case_id": "E-dynamo-static", "wall_seconds": None, "started": 2.0},  # untimed rerun: the timed row stays
    ]
    assert durations_from_rows(iter(rows)) == {
        "A-onnx-static": 7.0, "B-eager-dynamic": 3.0, "C-eager-static": 4.0, "E-dynamo-static": 2.0}
