"""What a notebook shows of a run: terminal escape codes an LM or a program printed are taken out of the trajectory's
views, the results and cost objects display as a summary or a table (not one dataclass line), a finished run read
back again shows no cost estimate, and a small validation set is said once."""

from __future__ import annotations

import io
import logging

from IPython.lib.pretty import pretty
from rich.console import Console
from support.optimizing import loop_optimizer
from support.tickets import RouteTicket, make_splits

from rlmoptimizer.display import Display
from rlmoptimizer.report.trajectory import Trajectory

RED = "\x1b[31m"
RESET = "\x1b[0m"


def test_terminal_escape_codes_are_taken_out_of_the_trajectorys_views():
    turn = {
        "iteration": 1,
        "reasoning": f"{RED}look{RESET} at <b>this</b>",
        "code": "print('x')",
        "output": f"{RED}score 0.5{RESET}",
    }
    trajectory = Trajectory([turn])
    table, full = trajectory._repr_html_(), trajectory.show(1)._repr_html_()
    for html in (table, full):
        assert "\x1b" not in html and "[31m" not in html
        assert "score 0.5" in html and "&lt;b&gt;this&lt;/b&gt;" in html  # escaped, not taken out
    assert "\x1b" not in repr(trajectory.show(1)) and "look at <b>this</b>" in repr(trajectory.show(1))
    buffer = io.StringIO()
    Display(True, Console(file=buffer, width=100, force_terminal=False, force_jupyter=False)).turn(turn)
    assert "\x1b" not in buffer.getvalue() and "score 0.5" in buffer.getvalue()

    # lines ended by \r\n (tickets, e-mails, CSV rows), with escape codes or without, keep their text
    crlf = {"iteration": 2, "reasoning": "look\r\nthen fix", "code": "x = 1\r\nprint(x)\r\n",
            "output": f"{RED}PASS{RESET} row 1\r\nFAIL row 2\r\n"}  # fmt: skip
    shown = repr(Trajectory([crlf]).show(2))
    assert "PASS row 1" in shown and "FAIL row 2" in shown
    buffer = io.StringIO()
    Display(True, Console(file=buffer, width=100, force_terminal=False, force_jupyter=False)).turn(crlf)
    for text in ("look", "then fix", "print(x)", "PASS row 1", "FAIL row 2"):
        assert text in buffer.getvalue()


def test_text_an_agent_prints_cannot_hide_other_text_or_act_on_the_terminal():
    """Regression: backspaces, a carriage return and an 8-bit CSI went through ``show(i)`` as they were, so code or
    output printed over itself read as something else in a terminal; the live display made a printed link
    clickable; an unterminated OSC, ``ESC c`` (reset), concealed text and bidirectional overrides hid text too."""
    hiding = {
        "iteration": 1,
        "reasoning": "fine",
        "code": "evil = 'steal()'  # " + "\b" * 30 + "print('hello')",  # backspaces over the real code
        "output": "evil output\rALL GOOD   \x9b2J",  # a carriage return over the output; an 8-bit CSI
    }
    linked = {
        "iteration": 2,
        "reasoning": "",
        "code": "",
        "output": "see \x1b]8;;https://evil.example/x\x1b\\the results\x1b]8;;\x1b\\.",
    }
    tricks = {
        "iteration": 3,
        "reasoning": "",
        "code": "access = 'user\u202e \u2066// admin\u2069 \u2066'",  # reads otherwise than it runs
        "output": "x = 1\x1b]\nTraceback: the real error\n\x1bc\x1b[8mconcealed\x1b[0m \x1b[31mred\x1b[0m",
    }
    shown = repr(Trajectory([hiding]).show(1))
    assert "steal()" in shown and "\\x08" in shown and "\b" not in shown
    assert "evil output\\rALL GOOD" in shown and "\\x9b2J" in shown and "\x9b" not in shown
    views = [Trajectory([hiding, linked])._repr_html_(), repr(Trajectory([linked]).show(2))]
    assert all("\x1b" not in view and "\\x1b]8;;https://evil.example/x" in view for view in views)
    shown = repr(Trajectory([tricks]).show(3))
    assert "the real error" in shown and "concealed" in shown and "red" in shown and "\\x1bc" in shown
    assert "\\u202e" in shown and "\\u2066" in shown and "\u202e" not in shown and "\x1b" not in shown
    for turn, kept in ((hiding, "steal()"), (linked, "the results"), (tricks, "the real error")):
        buffer = io.StringIO()
        Display(True, Console(file=buffer, width=200, force_terminal=True, force_jupyter=False)).turn(turn)
        out = buffer.getvalue()
        assert kept in out and "\b" not in out and "\x9b" not in out and "\x1b]" not in out and "\x1bc" not in out
        assert "\x1b[8m" not in out and "\u202e" not in out
    assert "\x1b[31m" in out  # colours are kept


def compile_loop(directory, console):
    train, val = make_splits()
    optimizer = loop_optimizer(directory, verbose=True, console=console)
    return optimizer, optimizer.compile(RouteTicket(), trainset=train, valset=val)


def test_results_and_costs_display_readably_and_a_finished_run_read_back_shows_no_estimate(tmp_path, caplog):
    first = io.StringIO()
    with caplog.at_level(logging.WARNING):
        optimizer, optimized = compile_loop(tmp_path, Console(file=first, width=120, force_jupyter=False))
    shown = first.getvalue()
    assert "Cost estimate (before any paid call)" in shown
    # 8 validation examples: said once, as the warning (the note that says the same is not shown beside it)
    said = shown + caplog.text
    assert said.count("decides what is returned") == 1

    results = optimized.detailed_results
    assert repr(results).startswith("DetailedResults(") and len(repr(results)) < 400
    assert f"best_idx={results.best_idx}" in repr(results) and "total_metric_calls=" in repr(results)
    assert pretty(optimized.cost_estimate) == str(optimized.cost_estimate)  # the table, in IPython and Jupyter
    assert pretty(optimized.cost_check) == str(optimized.cost_check)
    assert "\n" in pretty(optimized.cost_estimate)

    again = io.StringIO()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        compile_loop(tmp_path, Console(file=again, width=120, force_jupyter=False))
    assert "Cost estimate" not in again.getvalue() and "decides what is returned" not in again.getvalue() + caplog.text
