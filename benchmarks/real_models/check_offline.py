"""An offline check of the real-model benchmark's harness: the whole of ``run.py`` with fake LMs.

No server, model, build or network: ``run.start_servers`` starts nothing and ``run.make_lm`` returns fake LMs
(``rlmoptimizer.testing.FunctionLM``, metered like ``MeteredLM``). The fake task LM answers the default task's
tickets, and for a fixed fifth of them (every ticket whose id is a multiple of 5) a reply that does not parse;
it answers right when its prompt states the policy or shows demos, else ``customer_care``. The fake optimizer LM
fills whatever output fields it is asked for (an instruction naming the policy, a code cell for an agent).

It checks what the harness promises (``benchmarks/README.md``):

1. every program run is a metric call: in each arm, the program runs counted equal the fake task LM's calls
   (one call per run), unparsed runs included, and the metric function saw only the runs that parsed;
2. the test records each example's prediction of the task's own output field (None where nothing parsed), and a
   task whose output field is not ``queue`` (or has two) has its predictions recorded too;
3. the arms ran seed by seed;
4. (``run.sh --help`` is checked by the shell: it must answer without building; see the README);
5. (the reinstall guard is in ``run.sh``);
6. ``rlmoptimizer-loop`` is "not available" with a clear message on a library without that mode (or ran, on one
   with it); ``ceiling-demos`` put its four train demos in the prompt; ``ceiling-instruction`` the policy;
7. each rlmoptimizer and GEPA arm records the cost estimate made before its compile, and the table sets it beside
   what the arm spent.

    python benchmarks/real_models/check_offline.py [--keep DIR] [--arms a,b,...] [--seeds 0,1]

A few minutes on 2 cores (rlmoptimizer starts its sandbox once per seed). Exit status 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import dspy  # noqa: E402
import run  # noqa: E402
from metering import Meter, ProgramRuns  # noqa: E402

from rlmoptimizer.testing import FunctionLM  # noqa: E402

DATA = [json.loads(line) for line in (HERE / "tasks" / "ticket_routing.jsonl").read_text().splitlines() if line]
GOLD = {row["ticket"]: row["queue"] for row in DATA}
TICKET_ID = {row["ticket"]: int(row["id"][1:]) for row in DATA}
FIELD = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with|\Z)", re.S)
OUTPUTS = re.compile(r"Your output fields are:\n(.*?)(?:\n\n|\Z)", re.S)


def unparsable(ticket: str) -> bool:
    return TICKET_ID.get(ticket, 1) % 5 == 0


class FakeLM(FunctionLM):
    """A FunctionLM whose completed calls go to a ``Meter``, as ``metering.MeteredLM`` does for a real LM."""

    def __init__(self, fn, *, meter: Meter, name: str) -> None:
        super().__init__(fn, name=name)
        self.meter = meter

    def update_history(self, entry: dict[str, Any]) -> None:
        usage = entry.get("usage") or {}
        self.meter.record(
            {"prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0)}
        )
        super().update_history(entry)


def text_of(message: dict) -> str:
    content = message.get("content", "")
    return content if isinstance(content, str) else json.dumps(content)


def inputs_of(message: dict) -> dict[str, str]:
    return {name: value.strip() for name, value in FIELD.findall(text_of(message))}


def output_fields(system: str) -> list[str]:
    match = OUTPUTS.search(system)
    return re.findall(r"\d+\. `(\w+)`", match.group(1)) if match else []


def reply(fields: dict[str, Any], system: str) -> str:
    if "JSON object" in system:
        return json.dumps(fields)
    return "".join(f"[[ ## {k} ## ]]\n{v}\n\n" for k, v in fields.items()) + "[[ ## completed ## ]]"


class TaskLM:
    """The fake task LM's answers; ``seen_demos`` counts the prompts that showed the ceiling demos."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen_demos = 0
        self.seen_policy = 0

    def __call__(self, messages: list[dict]) -> str:
        system = text_of(messages[0])
        ticket = inputs_of(messages[-1]).get("ticket", "")
        if unparsable(ticket):
            return "I would send this one to the support team."  # no JSON: the JSONAdapter cannot parse it
        policy = "two-factor" in system
        demos = len(messages) > 2  # demos come as user/assistant pairs before the question
        with self.lock:
            self.seen_policy += policy
            self.seen_demos += any("Visa to reverse the charge" in text_of(m) for m in messages[1:-1])
        queue = GOLD.get(ticket, "customer_care") if policy or demos else "customer_care"
        fields = output_fields(system)
        answer = {"reasoning": "Routing by what the ticket says.", "queue": queue}
        return reply({k: answer.get(k, "") for k in fields} if fields else answer, system)


def optimizer_reply(messages: list[dict]) -> str:
    system = text_of(messages[0])
    fields = output_fields(system) or ["answer"]
    out: dict[str, Any] = {}
    for name in fields:
        if name == "code":
            out[name] = "print('looking at the data')"
        elif name == "reasoning":
            out[name] = "Look first."
        else:
            out[name] = (
                "Route the support ticket to a queue. Anything about two-factor authentication goes to security; "
                "chargebacks to billing_escalations; cancellations to retention; the rest to customer_care."
            )
    return reply(out, system)


def check(ok: bool, what: str, failures: list[str]) -> None:
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def check_predictions_of_other_tasks(failures: list[str]) -> None:
    """Item 2 beyond the default task: an output field named ``team``, and a task with two output fields."""

    class Team(dspy.Signature):
        """Pick a team."""

        ticket: str = dspy.InputField()
        team: str = dspy.OutputField()

    class Two(dspy.Signature):
        """Pick a team and a priority."""

        ticket: str = dspy.InputField()
        team: str = dspy.OutputField()
        priority: str = dspy.OutputField()

    def lm_fn(messages):
        ticket = inputs_of(messages[-1]).get("ticket", "")
        if ticket.endswith("!"):
            return "no fields here"
        system = text_of(messages[0])
        return reply({k: {"team": "alpha", "priority": "high"}[k] for k in output_fields(system)}, system)

    class TaskModule:
        @staticmethod
        def metric(example, pred, trace=None, pred_name=None, pred_trace=None):
            return float(getattr(pred, "team", None) == example.team)

    for signature, fields in ((Team, ["team"]), (Two, ["team", "priority"])):
        examples = [
            dspy.Example(ticket=f"ticket {i}{'!' if i == 2 else ''}", team="alpha", priority="high").with_inputs(
                "ticket"
            )
            for i in range(4)
        ]
        if signature is Team:
            examples = [dspy.Example(ticket=e.ticket, team=e.team).with_inputs("ticket") for e in examples]
        lm = FakeLM(lm_fn, meter=Meter("task"), name="fake-task")
        program = dspy.Predict(signature)
        runs = ProgramRuns(dspy.Predict)
        with dspy.context(lm=lm, callbacks=[runs], adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
            result = run.evaluate(program, examples, TaskModule, lm, lm.meter, 2, runs)
        expected_value = "alpha" if len(fields) == 1 else {"team": "alpha", "priority": "high"}
        check(
            result["output_fields"] == fields
            and result["predicted"] == [expected_value, expected_value, None, expected_value],
            f"predictions recorded for output field(s) {fields}: {result['predicted']}",
            failures,
        )
        check(
            result["program_runs"] == {"runs": 4, "unparsed": 1, "errors": 0} and result["metric_fn_calls"] == 3,
            f"test of {fields}: 4 runs, 1 unparsed, 3 metric-function calls ({result['program_runs']}, "
            f"{result['metric_fn_calls']})",
            failures,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", help="write the run here (default: a temporary folder, removed)")
    p.add_argument("--arms", default="unchanged,gepa,mipro,mipro-demos,rlmoptimizer,rlmoptimizer-loop")
    p.add_argument("--seeds", default="0,1")
    opts = p.parse_args(argv)
    failures: list[str] = []

    check_predictions_of_other_tasks(failures)

    task_lm_fn = TaskLM()
    made: dict[str, FakeLM] = {}

    def make_lm(model, meter, *, server, api_base, api_key, max_tokens, temperature):
        fn = task_lm_fn if meter.role == "task" else optimizer_reply
        made[meter.role] = FakeLM(fn, meter=meter, name=f"fake-{meter.role}")
        return made[meter.role]

    order: list[str] = []
    real_run_arm = run.run_arm

    def run_arm(key, seed, *args, **kwargs):
        order.append(run.arm_label(key, seed))
        return real_run_arm(key, seed, *args, **kwargs)

    run.make_lm = make_lm
    run.start_servers = lambda *a, **k: {}
    run.run_arm = run_arm

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(opts.keep or tmp)
        args = [
            "--out",
            str(out),
            "--ceiling",
            "--optimizers",
            opts.arms,
            "--seeds",
            opts.seeds,
            "--budget",
            "30",
            "--limit-val",
            "6",
            "--limit-test",
            "12",
            "--mipro-candidates",
            "3",
            "--rlm-max-turns",
            "3",
        ]
        run.main(args)
        parsed = run.parse_args(args)
        expected_order = [run.arm_label(k, s) for k, s in run.plan_runs(parsed.arms, parsed.seed_list)]
        check(order == expected_order, f"arms ran seed by seed: {order}", failures)

        rows = {p.stem: json.loads(p.read_text()) for p in sorted((out / "arms").glob("*.json"))}
        _, _, test = run.load_task(parsed.task).load()
        test = test[:12]
        expected_unparsed = [i for i, ex in enumerate(test) if unparsable(ex.ticket)]
        for name, row in rows.items():
            label = name.removesuffix(".failed")
            if row["status"] != "ok":
                if row["key"] == "rlmoptimizer-loop":
                    check(
                        row["status"] == "not available" and "has no rlm_autopilot='loop'" in row["error"],
                        f"{label}: not available: {row['error']}",
                        failures,
                    )
                else:
                    check(False, f"{label}: {row['status']}: {row['error']}", failures)
                continue
            o, t = row["optimize"], row["test"]
            runs = o["program_runs"]
            check(
                o["metric_calls"] == runs["runs"] == o["task_lm"]["calls"],
                f"{label}: metric calls = program runs = task-LM calls during optimization "
                f"({o['metric_calls']}, {runs['runs']}, {o['task_lm']['calls']}; {runs['unparsed']} unparsed, "
                f"{o['metric_fn_calls']} metric-function calls)",
                failures,
            )
            if row["key"] in ("gepa", "mipro", "mipro-demos", "rlmoptimizer"):
                check(
                    runs["unparsed"] > 0 and o["metric_fn_calls"] <= runs["runs"] - runs["unparsed"],
                    f"{label}: unparsed runs counted ({runs['unparsed']}) and not in the metric-function calls",
                    failures,
                )
            if row["key"] == "gepa":
                search = row["details"].get("gepa_search") or {}
                check(
                    search.get("total_metric_calls") == runs["runs"],
                    f"{label}: dspy.GEPA's own count of metric calls ({search.get('total_metric_calls')}) is the "
                    f"harness's count of program runs ({runs['runs']}); accepted children "
                    f"{search.get('accepted_children')}",
                    failures,
                )
            if row["key"] in ("gepa", "rlmoptimizer", "rlmoptimizer-loop"):
                estimate = row["details"].get("cost_estimate") or {}
                checked = row["key"] == "gepa" or "rows" in (row["details"].get("cost_check") or {})
                check(
                    "roles" in estimate and estimate.get("program_runs", 0) > 0 and checked,
                    f"{label}: the cost estimate recorded beside what was spent (predicted "
                    f"{estimate.get('program_runs')} metric calls, counted {o['metric_calls']})",
                    failures,
                )
            if "same_instructions_as" in t:
                continue
            nones = [i for i, v in enumerate(t["predicted"]) if v is None]
            check(
                t["program_runs"]["runs"] == len(test) and nones == expected_unparsed,
                f"{label}: test {t['program_runs']}, predictions None exactly where nothing parsed {nones}",
                failures,
            )
            check(
                all(isinstance(v, str) for i, v in enumerate(t["predicted"]) if i not in nones)
                and t["output_fields"] == ["queue"],
                f"{label}: predicted queues recorded ({Counter(t['predicted']).most_common(3)})",
                failures,
            )
        demos = rows.get("ceiling-demos", {})
        check(
            demos.get("status") == "ok" and len(demos.get("demos", {}).get("route.predict", [])) == 4,
            "ceiling-demos: 4 demos on route.predict",
            failures,
        )
        check(task_lm_fn.seen_demos > 0, f"the demos reached the task LM's prompt ({task_lm_fn.seen_demos})", failures)
        ceiling = rows.get("ceiling-instruction", {})
        check(
            ceiling.get("status") == "ok" and "two-factor" in ceiling["instructions"]["route.predict"],
            "ceiling-instruction: the policy instruction",
            failures,
        )
        table = (out / "table.md").read_text()
        check("metric calls (program runs)" in table and "Ceilings:" in table, "the table's columns", failures)
        check("The cost estimate made before each compile" in table, "the table of estimates beside spending", failures)
    print(f"\n{len(failures)} failed" if failures else "\nall checks hold")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
