"""How close does rlmoptimizer's Evaluator come to the ideal wall time, and to dspy.Evaluate?

A real DSPy program (ChainOfThought) runs on N examples with T threads over an offline LM that sleeps
L seconds per call. With one LM call per example, no evaluator can beat ``ceil(N / T) * L``; whatever
is above that is overhead (DSPy's adapters, our tracing, records, locks). The same program and LM are
then run through ``dspy.Evaluate(devset, metric, num_threads=T)``, and through the agent's
``evaluate_program(split='train')`` as the agent sees it: called from inside a real sandbox and timed there,
through the whole stack a compile() wires (tools, working program, runs with their cache, budget, pending
log, run store, journal and display observing), on a fresh run directory each time so nothing is reused.

    python benchmarks/bench_evaluation.py [--n 200] [--threads 8] [--latency 0.05] [--repeat 3] [--check]

Targets: ours within 5% of the limit, ours and the in-sandbox ``evaluate_program`` no slower than
dspy.Evaluate. ``--check`` exits with status 1 when a target is missed. Works from a checkout (the repository root is put on ``sys.path``) or with the
package installed.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DSPY_CACHEDIR", tempfile.mkdtemp(prefix="rlmopt-bench-cache-"))
_ROOT = Path(__file__).resolve().parents[1]
if (_ROOT / "rlmoptimizer" / "__init__.py").is_file():
    sys.path.insert(0, str(_ROOT))

import dspy  # noqa: E402

from rlmoptimizer.agent.services import CompileServices  # noqa: E402
from rlmoptimizer.agent.stop import StopRequest  # noqa: E402
from rlmoptimizer.agent.tools import AgentTools  # noqa: E402
from rlmoptimizer.agent.working_program import WorkingProgram  # noqa: E402
from rlmoptimizer.budget import BudgetLedger  # noqa: E402
from rlmoptimizer.display import Display  # noqa: E402
from rlmoptimizer.evaluation.evaluator import Evaluator  # noqa: E402
from rlmoptimizer.evaluation.runs import Runs  # noqa: E402
from rlmoptimizer.events import Observers  # noqa: E402
from rlmoptimizer.fingerprint import structural_fingerprint  # noqa: E402
from rlmoptimizer.metric import Metric  # noqa: E402
from rlmoptimizer.sandbox import Sandbox  # noqa: E402
from rlmoptimizer.storage.journal import RunJournal  # noqa: E402
from rlmoptimizer.storage.run_store import RunStore  # noqa: E402
from rlmoptimizer.testing import FunctionLM  # noqa: E402


def _question(messages: list[dict]) -> str:
    text = messages[-1]["content"]
    start = text.index("[[ ## question ## ]]\n") + len("[[ ## question ## ]]\n")
    return text[start : text.index("\n", start)]


def make_lm(latency: float) -> FunctionLM:
    """Answers ``a<i>`` to ``q<i>`` after sleeping ``latency`` seconds; never cached."""
    return FunctionLM(lambda m: {"reasoning": "Look it up.", "answer": _question(m).replace("q", "a")}, latency=latency)


def exact_match(example, prediction, trace=None):
    return example.answer == prediction.answer


def time_ours(program, devset, lm, threads: int) -> float:
    evaluator = Evaluator(metric=Metric(exact_match), lm=lm, num_threads=threads)
    start = time.perf_counter()
    records = evaluator.evaluate(program, list(enumerate(devset)))
    elapsed = time.perf_counter() - start
    assert len(records) == len(devset) and all(r.passed for r in records), "the benchmark program must pass"
    return elapsed


def time_dspy(program, devset, lm, threads: int) -> float:
    evaluate = dspy.Evaluate(devset=devset, metric=exact_match, num_threads=threads, display_progress=False)
    with dspy.context(lm=lm):
        start = time.perf_counter()
        result = evaluate(program)
        elapsed = time.perf_counter() - start
    assert result.score == 100.0, "the benchmark program must pass"
    return elapsed


class SandboxedTools:
    """A real sandbox whose ``evaluate_program`` tool is the agent's, wired as compile() wires it; each
    :meth:`time` builds a fresh run directory (no record reused) and times one call from inside the sandbox."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.tools: AgentTools | None = None
        self.box = Sandbox(tools={"evaluate_program": self.evaluate_program}, timeout_s=600)
        self._directories: list[tempfile.TemporaryDirectory] = []

    def evaluate_program(
        self,
        split: str = "train",
        limit: int | None = None,
        sample: str | None = None,
        ids: object = None,
        failed_from_run: str | None = None,
        seed: int = 0,
    ) -> dict:
        return self.tools.evaluate_program(
            split=split, limit=limit, sample=sample, ids=ids, failed_from_run=failed_from_run, seed=seed
        )

    def time(self, program, devset, lm) -> float:
        directory = tempfile.TemporaryDirectory(prefix="rlmopt-bench-runs-")
        self._directories.append(directory)
        store, journal = RunStore(directory.name), RunJournal(directory.name)
        observer = Observers([journal, Display(False)])
        ledger = BudgetLedger(10 * len(devset))
        evaluator = Evaluator(metric=Metric(exact_match), lm=lm, num_threads=self.threads)
        runs = Runs(evaluator=evaluator, store=store, ledger=ledger, splits={"train": devset}, observer=observer)
        working = WorkingProgram(
            program=program,
            fingerprint=structural_fingerprint(program),
            runs=runs,
            stop=StopRequest(),
            observer=observer,
        )
        self.tools = AgentTools(CompileServices(runs=runs, ledger=ledger, working=working))
        out = self.box.execute(
            "import time\n_t = time.perf_counter()\n_run = evaluate_program(split='train')\n"
            "print(time.perf_counter() - _t, _run['passed_count'], len(_run['examples']))"
        )
        store.flush()
        elapsed, passed, shown = str(out).split()
        assert int(passed) == int(shown) == len(devset), "the benchmark program must pass, every record shown"
        return float(elapsed)

    def close(self) -> None:
        self.box.shutdown()
        for directory in self._directories:
            directory.cleanup()


def time_bare_pool(program, devset, lm, threads: int) -> float:
    """The floor for any evaluator of this program: a thread pool calling it, nothing else (no metric,
    no records, no traces). What this is above the limit is DSPy's own per-call work."""

    def run(example):
        with dspy.context(lm=lm):
            return program(**example.inputs())

    with ThreadPoolExecutor(max_workers=threads) as pool:
        start = time.perf_counter()
        list(pool.map(run, devset))
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="examples (default 200)")
    parser.add_argument("--threads", type=int, default=8, help="threads (default 8)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per LM call (default 0.05)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each, median reported (default 3)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    logging.getLogger("dspy.evaluate.evaluate").setLevel(logging.WARNING)  # its "Average Metric" lines

    program = dspy.ChainOfThought("question -> answer")
    devset = [dspy.Example(question=f"q{i}", answer=f"a{i}").with_inputs("question") for i in range(args.n)]
    lm = make_lm(args.latency)

    sandboxed = SandboxedTools(args.threads)
    try:
        # Warm up every path (imports, adapter caches, thread start-up, the sandbox's start) outside the timings.
        warm = devset[: min(len(devset), 2 * args.threads)]
        time_ours(program, warm, make_lm(0.0), args.threads)
        time_dspy(program, warm, make_lm(0.0), args.threads)
        sandboxed.time(program, warm, make_lm(0.0))

        ours, theirs, bare, inside = [], [], [], []
        for _ in range(args.repeat):  # interleaved, so that background load hits all alike
            ours.append(time_ours(program, devset, lm, args.threads))
            theirs.append(time_dspy(program, devset, lm, args.threads))
            bare.append(time_bare_pool(program, devset, lm, args.threads))
            inside.append(sandboxed.time(program, devset, lm))
    finally:
        sandboxed.close()
    expected_calls = 4 * args.repeat * args.n
    assert len(lm.calls) == expected_calls, f"expected {expected_calls} LM calls, got {len(lm.calls)} (caching?)"

    ours_s, dspy_s, bare_s = statistics.median(ours), statistics.median(theirs), statistics.median(bare)
    inside_s = statistics.median(inside)
    limit = math.ceil(args.n / args.threads) * args.latency
    print(
        f"program: dspy.ChainOfThought, N={args.n} examples, T={args.threads} threads, L={args.latency} s per LM call"
    )
    print(f"runs: {args.repeat} of each, interleaved, medians below; ours: {_fmt(ours)}; dspy: {_fmt(theirs)}")
    print(f"ours (Evaluator.evaluate):        {ours_s:8.3f} s")
    print(f"ideal limit ceil(N/T)*L:          {limit:8.3f} s")
    ratio_limit = ours_s / limit if limit else float("inf")
    print(f"ours / limit:                     {ratio_limit:8.3f}   (target <= 1.05)")
    print(f"dspy.Evaluate(num_threads=T):     {dspy_s:8.3f} s   (dspy / limit {dspy_s / limit:.3f})")
    print(f"ours / dspy:                      {ours_s / dspy_s:8.3f}   (target <= 1.00)")
    print(f"floor: bare thread pool calling the program: {bare_s:8.3f} s   (bare / limit {bare_s / limit:.3f})")
    print(f"evaluate_program in the sandbox:  {inside_s:8.3f} s   (runs: {_fmt(inside)})")
    print(f"evaluate_program / dspy:          {inside_s / dspy_s:8.3f}   (target <= 1.00)")
    missed = []
    if ratio_limit > 1.05:
        missed.append("within 5% of the limit")
    if ours_s > dspy_s:
        missed.append("no slower than dspy.Evaluate")
    if inside_s > dspy_s:
        missed.append("evaluate_program no slower than dspy.Evaluate")
    print("targets: " + ("all met" if not missed else "missed: " + ", ".join(missed)))
    return 1 if (args.check and missed) else 0


def _fmt(times: list[float]) -> str:
    return ", ".join(f"{t:.3f}" for t in times)


if __name__ == "__main__":
    sys.exit(main())
