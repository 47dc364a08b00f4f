"""Which examples a tool evaluates: the ids the agent names (a list, or text such as ``'3,7,12'``), checked against
the split, narrowed to an earlier run's failures, shuffled reproducibly and cut to a limit.

May import: the standard library only.
"""

from __future__ import annotations

import random
import re
from typing import Any

__all__ = ["select_ids"]


def _parse_ids(ids: Any, split_size: int) -> list[int]:
    valid = f"valid ids are 0..{split_size - 1}" if split_size else "the split is empty"
    if isinstance(ids, str):
        parts = [p for p in re.split(r"[,\s]+", ids.strip()) if p]
        if not parts:
            raise ValueError(f"ids must be comma-separated example ids like '3,7,12', got an empty string; {valid}")
        try:
            parsed = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"ids must be comma-separated integers like '3,7,12', got {ids!r}; {valid}") from None
    elif isinstance(ids, int) and not isinstance(ids, bool):
        parsed = [ids]
    elif isinstance(ids, (list, tuple)):
        parsed = []
        for item in ids:
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                raise ValueError(f"ids must be a list of integers like [3, 7, 12], got {ids!r}; {valid}")
            try:
                parsed.append(int(item))
            except ValueError:
                raise ValueError(f"ids must be a list of integers like [3, 7, 12], got {ids!r}; {valid}") from None
        if not parsed:
            raise ValueError(f"ids is empty; pass ids=None to select every example, or ids like '3,7,12'; {valid}")
    else:
        raise ValueError(f"ids must be a string like '3,7,12' or a list of integers, got {type(ids).__name__} {ids!r}")
    bad = [i for i in parsed if not 0 <= i < split_size]
    if bad:
        shown = f"{bad[:10]}" + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise ValueError(f"ids must be example ids of the split, got out-of-range {shown}; {valid}")
    return list(dict.fromkeys(parsed))


def select_ids(
    split_size: int,
    *,
    limit: int | None = None,
    sample: str | None = None,
    seed: int = 0,
    ids: Any = None,
    failed_ids_from_run: list[int] | None = None,
) -> list[int]:
    """The example ids to evaluate: all in order by default, narrowed by ``ids``, by the failed ids of an
    earlier run, shuffled reproducibly when ``sample='random'``, then cut to the first ``limit``.
    :class:`ValueError` says what is wrong with an argument."""
    if sample not in (None, "first", "random"):
        raise ValueError(f"sample must be 'random' (shuffled with seed) or None (in id order), got {sample!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be an integer >= 0 or None (no limit), got {limit!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    selected = list(range(split_size)) if ids is None else _parse_ids(ids, split_size)
    if failed_ids_from_run is not None:
        failed = set(_parse_ids(list(failed_ids_from_run), split_size)) if failed_ids_from_run else set()
        selected = [i for i in selected if i in failed]
    if sample == "random":
        random.Random(seed).shuffle(selected)
    if limit is not None:
        selected = selected[:limit]
    return selected
