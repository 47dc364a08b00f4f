"""Walking an exception chain: the one walk every classifier of wrapped failures uses."""

from __future__ import annotations

from rlmoptimizer.errors import exception_chain


def test_the_chain_holds_the_error_what_it_was_raised_from_and_what_it_was_handling_each_once():
    try:
        try:
            raise KeyError("first")
        except KeyError:
            try:
                raise OSError("handled")
            except OSError as handled:
                raise RuntimeError("wrapper") from handled
    except RuntimeError as outer:
        chain = list(exception_chain(outer))
    assert [type(e) for e in chain] == [RuntimeError, OSError, KeyError]
    looped = ValueError("a")
    other = TypeError("b")
    looped.__cause__, other.__cause__ = other, looped
    assert list(exception_chain(looped)) == [looped, other]
    assert list(exception_chain(None)) == []


def test_a_long_chain_is_cut_at_the_limit():
    errors = [ValueError(str(n)) for n in range(40)]
    for outer, inner in zip(errors, errors[1:], strict=False):
        outer.__cause__ = inner
    assert list(exception_chain(errors[0])) == errors[:16]
    assert list(exception_chain(errors[0], limit=3)) == errors[:3]
