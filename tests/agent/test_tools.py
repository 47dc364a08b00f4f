"""The agent's selection of example ids: parsed once, with errors that say what to pass."""

from __future__ import annotations

import pytest

from rlmoptimizer.agent.tools import select_ids


def test_select_ids_defaults_ids_failed_sample_and_limit():
    assert select_ids(5) == [0, 1, 2, 3, 4]
    assert select_ids(50, ids="3, 7,12") == [3, 7, 12]
    assert select_ids(50, ids=[12, 3, 12]) == [12, 3]
    assert select_ids(50, ids=[12, 3], failed_ids_from_run=[3, 4]) == [3]
    assert select_ids(10, failed_ids_from_run=[9, 2]) == [2, 9]
    assert select_ids(10, failed_ids_from_run=[]) == []
    assert select_ids(10, limit=3) == [0, 1, 2]
    assert select_ids(10, limit=0) == []
    shuffled = select_ids(50, sample="random", seed=7)
    assert sorted(shuffled) == list(range(50)) and shuffled != list(range(50))
    assert select_ids(50, sample="random", seed=7, limit=5) == shuffled[:5]
    assert select_ids(50, sample="random", seed=8) != shuffled


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ids": "3,x"}, r"comma-separated integers like '3,7,12', got '3,x'; valid ids are 0\.\.49"),
        ({"ids": [3, 50]}, r"out-of-range \[50\]; valid ids are 0\.\.49"),
        ({"ids": ""}, "empty string"),
        ({"ids": []}, "ids is empty"),
        ({"limit": -1}, r"limit must be an integer >= 0.*got -1"),
        ({"sample": "top"}, r"sample must be 'random'.*got 'top'"),
        ({"failed_ids_from_run": [99]}, "out-of-range"),
    ],
)
def test_select_ids_explains_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        select_ids(50, **kwargs)


# -- the run service -----------------------------------------------------------------------------
