"""A run directory's manifest as a compile() writes it, with short stand-ins for the digests; tests change one
key (``{**MANIFEST, "metric": "other"}``) to make another compile's."""

from __future__ import annotations

MANIFEST = {
    "program": "p",
    "trainset": "t",
    "valset": "v",
    "examples_digest_version": 2,
    "eval_lm": {"lm": {"model": "task"}, "per_step": {}},
    "metric": "m",
    "budget_limit": 10,
    "budget_mode": {"max_iterations": 2},
    "pass_threshold": 1.0,
}
