"""Compare the unchanged program, rlmoptimizer, GEPA and MIPROv2 on one task with real models.

Run it through ``bash benchmarks/real_models/run.sh [flags]``, which installs what it needs first; see
``benchmarks/README.md`` (``--help``, parsed by ``cli.py``, answers without installing anything). With the default
``--task-model local --optimizer-model local`` this assembles the GGUF model, starts llama-cpp-python servers on
127.0.0.1 (one per role: the task LM's and the optimizer LM's), checks that they answer, runs every arm and stops
the servers at the end, also on an error, Ctrl-C or SIGTERM.

Two servers of the same model file rather than one: a server keeps one prompt's KV cache per slot, and on 2
cores one slot is fastest. Sharing it, every task-LM evaluation would evict the optimizer's long prompt (an
agent's growing history, MIPROv2's proposer context) and the next optimizer call would re-read all of it. The
two rarely compute at once (an optimizer waits for its evaluations), so they do not compete for the cores.

Every arm gets a fresh copy of the task's program, the same train/val data, the same task LM, the same
optimizer LM and the same budget of B metric calls; every resulting program is scored on the test split
with the task LM. DSPy's cache is off (memory and disk, and ``cache=False`` on each LM), so no arm reuses
another's answers and every arm pays for its own calls. A metric call is one run of the program on one example,
counted where the program runs (``metering.ProgramRuns``), so a run whose output does not parse, which never
reaches the metric, is counted too.

Each optimizer runs once per seed (``--seeds``), seed by seed: every arm's seed 0, then every arm's seed 1, and
so on (the unchanged program and the ceilings once, in the first round), so a run stopped anywhere leaves matched
pairs. Every finished arm is saved at once to ``<out>/arms/<arm>[-seed<k>].json`` (its per-ticket test
correctness and predictions, instructions and demos, metric calls, LM usage by role, wall time, the machine's load
during it, the library's commit); an arm whose file is there is not run again when the same ``--out`` is given,
so a stopped run continues where it stopped. The table is built from every arm file in ``<out>/arms``, whichever
invocation wrote it, and refuses files written with other settings.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import datetime  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import dspy  # noqa: E402
from arms import ARMS, ArmContext, Unavailable, demos_of, instructions_of  # noqa: E402
from cli import ARM_HELP, LOCAL, SEEDED, parse_args, plan_runs  # noqa: E402  (standard library only)
from local_model import WEIGHTS, ensure_weights, llama_server  # noqa: E402
from metering import CountingMetric, Meter, MeteredLM, ProgramRuns  # noqa: E402
from stats import mcnemar, sign_test, spread  # noqa: E402

log = logging.getLogger("bench")
_interrupted = threading.Event()

# cli.py knows the arms without importing dspy (for --help); the two lists must agree.
assert list(ARMS) == list(ARM_HELP), (list(ARMS), list(ARM_HELP))
assert SEEDED == {key for key, arm in ARMS.items() if arm.seeded}, SEEDED


def _interrupt(signum, frame) -> None:
    """Ctrl-C, SIGTERM and SIGHUP all become KeyboardInterrupt in the main thread, so every ``finally`` (the
    servers' included) runs and dspy's parallel evaluation cancels its pending examples. The flag survives
    dspy turning the interrupt into ``Exception("Execution cancelled ...")``, which ``run_arm`` re-raises."""
    _interrupted.set()
    signal.default_int_handler(signum, frame)


def load_task(spec: str) -> ModuleType:
    """A task module from a file path or a dotted module name; it must expose load, make_program, metric."""
    path = Path(spec)
    if path.suffix == ".py" or path.exists():
        if not path.is_file():
            raise SystemExit(f"--task {spec}: no such file")
        module_spec = importlib.util.spec_from_file_location(f"bench_task_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(spec)
    missing = [name for name in ("load", "make_program", "metric") if not callable(getattr(module, name, None))]
    if missing:
        raise SystemExit(
            f"--task {spec}: the module lacks {missing}; a task exposes load() -> (train, val, test), "
            "make_program() -> dspy.Module and metric(example, pred, trace=None, pred_name=None, "
            "pred_trace=None)"
        )
    return module


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor()
    mem_gb = None
    try:
        kb = int(
            next(
                line.split()[1]
                for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")
            )
        )
        mem_gb = round(kb / 1024 / 1024, 1)
    except (OSError, StopIteration, ValueError):
        pass
    versions = {}
    for package in ("dspy", "gepa", "optuna", "litellm", "llama_cpp_python", "rlmoptimizer"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory_gb": mem_gb,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }


def make_lm(model: str, meter: Meter, *, server, api_base, api_key, max_tokens: int, temperature: float) -> MeteredLM:
    if model == LOCAL:
        name, api_base, api_key = f"openai/{server.alias}", server.api_base, "local"
    else:
        name = model
    extra = {k: v for k, v in (("api_base", api_base), ("api_key", api_key)) if v}
    # engine="litellm": dspy 3.4.1's default engine sends max_completion_tokens, which llama.cpp ignores.
    return MeteredLM(
        name,
        meter=meter,
        engine="litellm",
        cache=False,
        max_tokens=max_tokens,
        temperature=temperature,
        num_retries=2,
        **extra,
    )


def _optimizer_window(args) -> int | None:
    """The optimizer LM's context window when it is served here (litellm knows none for the local model)."""
    if args.optimizer_model != LOCAL:
        return None
    return max(args.n_ctx, args.task_n_ctx) if args.one_server else args.n_ctx


# The settings an arm's result depends on. Arm files written with other values are refused, not mixed in:
# the unchanged program and the policy instruction depend on the program's (what is scored, by which LM), an
# optimizer arm on the optimizer's too.
PROGRAM_SETTINGS = (
    "task",
    "program_options",
    "split_sizes",
    "test_sha256",
    "task_model",
    "local_model",
    "task_max_tokens",
    "task_temperature",
)
OPTIMIZER_SETTINGS = (
    "budget",
    "optimizer_model",
    "optimizer_max_tokens",
    "optimizer_temperature",
    "num_threads",
    "mipro_candidates",
    "mipro_minibatch_size",
    "mipro_full_eval_steps",
    "rlm_max_turns",
    "rlm_max_llm_calls",
    "n_ctx",
    "one_server",
)


def arm_label(key: str, seed: int | None) -> str:
    return key if seed is None else f"{key}-seed{seed}"


def comparable_settings(args, task_spec: str, program_options: dict, data) -> dict[str, Any]:
    train, val, test = data
    test_sha = hashlib.sha256("\n".join(str(ex.toDict()) for ex in test).encode()).hexdigest()
    values = {
        **vars(args),
        "task": Path(task_spec).name,
        "program_options": program_options,
        "split_sizes": {"train": len(train), "val": len(val), "test": len(test)},
        "test_sha256": test_sha,
    }
    return {k: values[k] for k in PROGRAM_SETTINGS + OPTIMIZER_SETTINGS}


def check_settings(row: dict, settings: dict, path: Path) -> None:
    keys = PROGRAM_SETTINGS if not ARMS[row["key"]].seeded else PROGRAM_SETTINGS + OPTIMIZER_SETTINGS
    differ = {
        k: (row.get("settings", {}).get(k), settings[k]) for k in keys if row.get("settings", {}).get(k) != settings[k]
    }
    if differ:
        raise SystemExit(
            f"{path} was written with other settings ({', '.join(f'{k}: {a!r} there, {b!r} now' for k, (a, b) in differ.items())}); "
            "use another --out, or the same settings to continue that run"
        )


class LoadSampler:
    """The machine's 1-minute load average, sampled every ``every_s`` seconds in a daemon thread."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.samples: list[tuple[float, float]] = []
        self._every = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="load-sampler")

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), os.getloadavg()[0]))
            if self._stop.wait(self._every):
                return

    def between(self, start: float, end: float) -> dict[str, Any]:
        values = [v for t, v in self.samples if start <= t <= end] or [os.getloadavg()[0]]
        return {
            "min": round(min(values), 2),
            "mean": round(sum(values) / len(values), 2),
            "max": round(max(values), 2),
            "samples": len(values),
        }


def run_arm(
    key: str,
    seed: int | None,
    args,
    task,
    data,
    task_lm,
    optimizer_lm,
    meters,
    out_dir: Path,
    scored: dict[str, tuple[str, dict]],
    settings: dict,
    loads: LoadSampler,
    runs: ProgramRuns | None = None,
) -> dict[str, Any]:
    """One arm: optimize, then score on test. Failures become the row's status; only Ctrl-C stops the run.

    ``scored`` maps the prompt of every program scored so far (its instructions and demos, see
    :func:`prompt_key`) to (arm, test result): a program whose prompt was already scored (an optimizer that
    returned the unchanged program) reuses that score instead of paying for the same test run again (the task LM
    runs at temperature 0 by default).

    ``runs`` counts the program's runs (``metering.ProgramRuns``, installed as a global dspy callback): the row's
    ``optimize.metric_calls`` are the runs during the optimization, an output that does not parse included;
    ``optimize.metric_fn_calls`` are the calls of the metric that scored a run (fewer when outputs did not
    parse: those never reach the metric)."""
    arm = ARMS[key]
    label = arm_label(key, seed)
    train, val, test = data
    work_dir = out_dir / "work" / label
    shutil.rmtree(work_dir, ignore_errors=True)  # an arm that was stopped starts over, not from its files
    work_dir.mkdir(parents=True)
    metric = CountingMetric(task.metric, as_float=arm.metric_as_float)
    ctx = ArmContext(
        program=make_program(task, args),
        train=train,
        val=val,
        task_lm=task_lm,
        optimizer_lm=optimizer_lm,
        metric=metric,
        budget=args.budget,
        num_threads=args.num_threads,
        seed=seed or 0,
        work_dir=work_dir,
        options={
            "mipro_candidates": args.mipro_candidates,
            "mipro_minibatch_size": args.mipro_minibatch_size,
            "mipro_full_eval_steps": args.mipro_full_eval_steps,
            "rlm_max_turns": args.rlm_max_turns,
            "rlm_max_llm_calls": args.rlm_max_llm_calls,
            "root_context_window": _optimizer_window(args),
        },
        policy_instruction=getattr(task, "POLICY_INSTRUCTION", None),
        task=task,
    )
    row: dict[str, Any] = {
        "arm": arm.name,
        "key": key,
        "seed": seed,
        "label": label,
        "status": "ok",
        "error": None,
        "settings": settings,
        "rlm_commit": os.environ.get("RLMOPT_BENCH_COMMIT"),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "details": {},
    }
    log.info("=== %s: optimizing (budget %d metric calls) ===", label, args.budget)
    before = {role: meter.snapshot() for role, meter in meters.items()}
    runs_before = runs.snapshot() if runs is not None else None
    started, started_epoch = time.perf_counter(), time.time()
    program = None
    try:
        with dspy.context(lm=task_lm):
            program, row["details"] = arm.run(ctx)
    except Unavailable as e:
        row["status"], row["error"] = "not available", str(e)
    except Exception as e:  # a failing optimizer is a result, not the end of the benchmark
        if _interrupted.is_set():
            raise KeyboardInterrupt from e
        row["status"], row["error"] = "error", f"{type(e).__name__}: {e}"
        row["traceback"] = traceback.format_exc()
    program_runs = (runs.snapshot() - runs_before).to_dict() if runs is not None else None
    row["optimize"] = {
        "wall_s": round(time.perf_counter() - started, 1),
        # the honest count: every program run paid for, whether or not its output parsed (see metering.py)
        "metric_calls": program_runs["runs"] if program_runs is not None else metric.scored,
        "metric_calls_counted_as": "program runs" if program_runs is not None else "metric function calls",
        "program_runs": program_runs,
        "metric_fn_calls": metric.scored,
        "feedback_calls": metric.feedback,
        **{f"{role}_lm": (meter.snapshot() - before[role]).to_dict() for role, meter in meters.items()},
        "load_1min": loads.between(started_epoch, time.time()),
    }
    if row["status"] != "ok":
        log.warning("%s: %s: %s", label, row["status"], row["error"])
        return row
    row["instructions"] = instructions_of(program)
    demos = demos_of(program)
    if demos:
        row["demos"] = demos
    same = prompt_key(row)
    if same in scored and args.task_temperature == 0:
        earlier, row["test"] = scored[same]
        row["test"] = {**row["test"], "same_instructions_as": earlier}
        log.info(
            "%s: optimized in %.0f s with %d metric calls; same prompt as %s: test score %.1f%% reused",
            label,
            row["optimize"]["wall_s"],
            row["optimize"]["metric_calls"],
            earlier,
            100 * row["test"]["score"],
        )
        return row
    log.info(
        "%s: optimized in %.0f s with %d metric calls (%s); scoring on %d test examples",
        label,
        row["optimize"]["wall_s"],
        row["optimize"]["metric_calls"],
        describe_runs(program_runs, metric.scored),
        len(test),
    )
    test_started = time.time()
    try:
        row["test"] = evaluate(program, test, task, task_lm, meters["task"], args.num_threads, runs)
    except Exception as e:  # e.g. the server died: the row says so, the next arm still runs
        if _interrupted.is_set():
            raise KeyboardInterrupt from e
        row["status"], row["error"] = "error", f"test evaluation failed: {type(e).__name__}: {e}"
        row["traceback"] = traceback.format_exc()
        return row
    row["test"]["load_1min"] = loads.between(test_started, time.time())
    log.info(
        "%s: test score %.1f%% (%d/%d) in %.0f s",
        label,
        100 * row["test"]["score"],
        row["test"]["correct"],
        row["test"]["total"],
        row["test"]["wall_s"],
    )
    scored[same] = (label, row["test"])
    return row


def prompt_key(row: dict) -> str:
    """What decides a program's test answers besides the LM: its instructions, and its demos when it has any
    (a row without demos keys as the earlier files did, by its instructions alone)."""
    if row.get("demos"):
        return json.dumps({"instructions": row["instructions"], "demos": row["demos"]}, sort_keys=True)
    return json.dumps(row["instructions"], sort_keys=True)


def describe_runs(program_runs: dict | None, metric_fn_calls: int) -> str:
    if program_runs is None:
        return f"{metric_fn_calls} metric function calls"
    return (
        f"{program_runs['runs']} program runs, {program_runs['unparsed']} unparsed, {program_runs['errors']} "
        f"other errors; {metric_fn_calls} metric function calls"
    )


def output_fields(task, examples) -> list[str]:
    """The task's output fields: its ``OUTPUT_FIELDS`` when it defines them, else the label fields (those not
    marked as inputs) of its first example."""
    fields = getattr(task, "OUTPUT_FIELDS", None)
    if fields:
        return list(fields)
    return list(examples[0].labels().keys()) if examples else []


def json_value(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool | type(None)) else str(value)


def predicted_values(predictions: list, fields: list[str]) -> list:
    """Each example's predicted output: the value of the one output field (the earlier files' form), or a dict of
    them when the task has several; None when the program produced no output (it raised, e.g. did not parse)."""
    out = []
    for pred in predictions:
        if pred is None or not len(pred.keys()):
            out.append(None)
        elif len(fields) == 1:
            out.append(json_value(pred.get(fields[0])))
        else:
            out.append({f: json_value(pred.get(f)) for f in fields})
    return out


def make_program(task, args) -> dspy.Module:
    return task.make_program(**program_options(task, args))


def program_options(task, args) -> dict[str, str]:
    """The ``--predictor``/``--adapter`` values given, checked against the task's ``OPTIONS``."""
    given = {k: getattr(args, k) for k in ("predictor", "adapter") if getattr(args, k) is not None}
    options = getattr(task, "OPTIONS", {})
    for name, value in given.items():
        if name not in options:
            raise SystemExit(f"--{name}: the task {args.task} has no {name} setting (its OPTIONS: {options})")
        if value not in options[name]:
            raise SystemExit(f"--{name} {value}: the task {args.task} takes {', '.join(options[name])}")
    return given


def evaluate(
    program, test, task, task_lm, task_meter: Meter, num_threads: int, runs: ProgramRuns | None = None
) -> dict[str, Any]:
    metric = CountingMetric(task.metric, as_float=True)
    before = task_meter.snapshot()
    runs_before = runs.snapshot() if runs is not None else None
    started = time.perf_counter()
    with dspy.context(lm=task_lm):
        result = dspy.Evaluate(
            devset=test,
            metric=metric,
            num_threads=num_threads,
            display_progress=False,
            max_errors=len(test) + 1,
            provide_traceback=False,
        )(program)
    per_ticket = [float(score) for *_, score in result.results]  # in the test split's order
    fields = output_fields(task, test)
    correct = sum(per_ticket)
    return {
        "score": correct / len(test),
        "correct": int(round(correct)),
        "total": len(test),
        "per_ticket": per_ticket,
        "output_fields": fields,
        "predicted": predicted_values([pred for _, pred, _ in result.results], fields),
        "program_runs": (runs.snapshot() - runs_before).to_dict() if runs is not None else None,
        "metric_fn_calls": metric.scored,
        "wall_s": round(time.perf_counter() - started, 1),
        "task_lm": (task_meter.snapshot() - before).to_dict(),
    }


def fmt_tokens(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


TABLE_HEADER = (
    "run",
    "test score",
    "metric calls (program runs)",
    "task-LM calls",
    "task tokens in/out",
    "optimizer-LM calls",
    "optimizer tokens in/out",
    "task $",
    "optimizer $",
    "wall time",
    "load (1-min avg)",
)


def dollars(model: str, price_as: str, usage: dict[str, Any]) -> str:
    """The dollars of ``usage`` (input/output token totals) at litellm's price for ``model``, or, for the local
    model (no price), at ``price_as``'s; "?" when neither is priced."""
    from rlmoptimizer.usage import price_of_call

    cost = price_of_call(model, usage["input_tokens"], usage["output_tokens"]) if model != LOCAL else None
    if cost is None:
        cost = price_of_call(price_as, usage["input_tokens"], usage["output_tokens"])
    return "?" if cost is None else f"{float(cost):.4f}"


def table_rows(
    rows: list[dict],
    models: dict[str, str] | None = None,
    price_as: str = "openai/gpt-4o-mini",
) -> list[tuple[str, ...]]:
    """One line per run (arm and seed), with what its optimization cost."""
    models = models or {"task": LOCAL, "optimizer": LOCAL}
    out = []
    for row in rows:
        name = row.get("label", row["arm"])
        if row["status"] != "ok":
            out.append((name, f"{row['status']}: {row['error']}"[:120], *[""] * (len(TABLE_HEADER) - 2)))
            continue
        o, t = row["optimize"], row["test"]
        same = f" (same prompt as {t['same_instructions_as']})" if t.get("same_instructions_as") else ""
        load = o.get("load_1min")
        if counted_runs(row):
            runs = o.get("program_runs") or {}
            calls = f"{o['metric_calls']} ({runs.get('unparsed', 0)} unparsed)"
        else:
            calls = f"{o['metric_calls']}*"
        out.append(
            (
                name,
                f"{100 * t['score']:.1f}% ({t['correct']}/{t['total']}){same}",
                calls,
                str(o["task_lm"]["calls"]),
                f"{fmt_tokens(o['task_lm']['input_tokens'])} / {fmt_tokens(o['task_lm']['output_tokens'])}",
                str(o["optimizer_lm"]["calls"]),
                f"{fmt_tokens(o['optimizer_lm']['input_tokens'])} / {fmt_tokens(o['optimizer_lm']['output_tokens'])}",
                dollars(models["task"], price_as, o["task_lm"]),
                dollars(models["optimizer"], price_as, o["optimizer_lm"]),
                f"{o['wall_s'] / 60:.1f} min",
                f"{load['mean']:.1f} ({load['min']:.1f}-{load['max']:.1f})" if load else "",
            )
        )
    return out


ESTIMATE_HEADER = (
    "run",
    "estimate of",
    "metric calls: predicted / counted",
    "task tokens in/out: predicted / spent",
    "optimizer-LM calls: predicted / spent",
    "optimizer tokens in/out: predicted / spent",
    "spent ÷ predicted (task, optimizer tokens)",
)


def _tokens_of(usage: dict) -> int:
    return usage.get("input_tokens", 0) + usage.get("output_tokens", 0)


def _ratio(spent: float, predicted: float) -> str:
    return f"{spent / predicted:.2f}x" if predicted else "-"


def estimate_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """One line per run whose arm recorded a cost estimate made before its compile (``details.cost_estimate``, see
    ``arms.py``), beside what the harness counted it spend: metric calls, task-LM and optimizer-LM calls and
    tokens (the estimate's eval role is the task LM's; its sub and root roles, the optimizer LM's)."""
    out = []
    for row in rows:
        estimate = (row.get("details") or {}).get("cost_estimate")
        if row["status"] != "ok" or not isinstance(estimate, dict) or "roles" not in estimate:
            continue
        roles = {r["role"]: r for r in estimate["roles"]}
        task = roles.get("eval", {})
        opt = {
            k: sum(roles.get(role, {}).get(k, 0) for role in ("sub", "root"))
            for k in ("calls", "input_tokens", "output_tokens")
        }
        o = row["optimize"]
        spent_task, spent_opt = o["task_lm"], o["optimizer_lm"]
        out.append(
            (
                row.get("label", row["arm"]),
                (row.get("details") or {}).get("estimate_of", "this arm"),
                f"{estimate['program_runs']} / {o['metric_calls']}",
                f"{fmt_tokens(task.get('input_tokens', 0))} / {fmt_tokens(task.get('output_tokens', 0))} ; "
                f"{fmt_tokens(spent_task['input_tokens'])} / {fmt_tokens(spent_task['output_tokens'])}",
                f"{opt['calls']} / {spent_opt['calls']}",
                f"{fmt_tokens(opt['input_tokens'])} / {fmt_tokens(opt['output_tokens'])} ; "
                f"{fmt_tokens(spent_opt['input_tokens'])} / {fmt_tokens(spent_opt['output_tokens'])}",
                f"{_ratio(_tokens_of(spent_task), _tokens_of(task))}, {_ratio(_tokens_of(spent_opt), _tokens_of(opt))}",
            )
        )
    return out


def markdown(header: tuple[str, ...], cells: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])


def markdown_table(rows: list[dict], models: dict[str, str] | None = None, price_as: str = "openai/gpt-4o-mini") -> str:
    return markdown(TABLE_HEADER, table_rows(rows, models, price_as))


def _pm(stats: dict, fmt: str = "{:.1f}") -> str:
    return fmt.format(stats["mean"]) + (" ± " + fmt.format(stats["sd"]) if stats["n"] > 1 else "")


# References each arm is compared with ticket by ticket (when present): the unchanged program, GEPA, and MIPROv2
# with demos (issue 38's goal: rlmoptimizer above GEPA and above MIPROv2 with demos).
REFERENCES = ("unchanged", "gepa", "mipro-demos")
# Arms that state a ceiling, compared with the unchanged program (the first present of each pair).
CEILINGS = (("instruction", ("ceiling-instruction", "policy")), ("demos", ("ceiling-demos",)))


def counted_runs(row: dict) -> bool:
    """Whether the row's metric calls are counted program runs (every file since issue 38), not the metric
    function calls of the earlier files (which missed the runs whose output did not parse)."""
    return row["optimize"].get("metric_calls_counted_as") == "program runs"


def summarize(rows: list[dict]) -> dict[str, Any]:
    """Per arm over its seeds: accuracy, metric calls, optimizer-LM tokens and wall time (mean, sd, min, max),
    ratios to GEPA's means, and the paired per-ticket comparisons with each of ``REFERENCES`` present
    (McNemar per seed against the reference's run of the same seed, or its one run when it is not seeded; a
    sign test over tickets of the seed-averaged correctness, all seeds pooled), and the ceilings."""
    ok = [r for r in rows if r["status"] == "ok" and "per_ticket" in r.get("test", {})]
    by_key: dict[str, list[dict]] = {}
    for row in ok:
        by_key.setdefault(row["key"], []).append(row)
    for runs in by_key.values():
        runs.sort(key=lambda r: r["seed"] if r["seed"] is not None else -1)
    arms: dict[str, Any] = {}
    for key, runs in by_key.items():
        tokens = [
            r["optimize"]["optimizer_lm"]["input_tokens"] + r["optimize"]["optimizer_lm"]["output_tokens"] for r in runs
        ]
        arms[key] = {
            "name": runs[0]["arm"],
            "seeds": [r["seed"] for r in runs],
            "accuracy": spread([100 * r["test"]["score"] for r in runs]),
            "per_seed_correct": [f"{r['test']['correct']}/{r['test']['total']}" for r in runs],
            "metric_calls": spread([r["optimize"]["metric_calls"] for r in runs]),
            # False when some seed's file predates the count of program runs (its metric calls undercount)
            "metric_calls_are_runs": all(counted_runs(r) for r in runs),
            "unparsed_runs": spread([(r["optimize"].get("program_runs") or {}).get("unparsed", 0) for r in runs])
            if all(counted_runs(r) for r in runs)
            else None,
            "optimizer_tokens": spread(tokens),
            "optimizer_tokens_in": spread([r["optimize"]["optimizer_lm"]["input_tokens"] for r in runs]),
            "optimizer_tokens_out": spread([r["optimize"]["optimizer_lm"]["output_tokens"] for r in runs]),
            "wall_min": spread([r["optimize"]["wall_s"] / 60 for r in runs]),
            # the load while it optimized, or while it was scored when it did not optimize (unchanged, ceilings)
            "load_1min_mean": spread(
                [
                    (r["optimize"] if ARMS[key].seeded else r["test"]).get("load_1min", {}).get("mean", float("nan"))
                    for r in runs
                ]
            ),
            "rlm_commits": sorted({r.get("rlm_commit") or "?" for r in runs})
            if key.startswith("rlmoptimizer")
            else None,
        }
    gepa = arms.get("gepa")
    for key, summary in arms.items():
        if gepa and key != "gepa" and ARMS[key].seeded and gepa["optimizer_tokens"]["mean"] > 0:
            summary["tokens_vs_gepa"] = summary["optimizer_tokens"]["mean"] / max(gepa["optimizer_tokens"]["mean"], 1)
            summary["wall_vs_gepa"] = summary["wall_min"]["mean"] / max(gepa["wall_min"]["mean"], 1e-9)
        for other in REFERENCES:
            if other == key or other not in by_key:
                continue
            ref = by_key[other]
            per_seed = []
            for run in by_key[key]:
                if ARMS[other].seeded:
                    partner = next((r for r in ref if r["seed"] == run["seed"]), None)
                else:
                    partner = ref[0]
                if partner is not None:
                    per_seed.append(
                        {"seed": run["seed"], **mcnemar(run["test"]["per_ticket"], partner["test"]["per_ticket"])}
                    )
            summary[f"vs_{other}"] = {
                "mcnemar_per_seed": per_seed,
                "sign_test_pooled": sign_test(
                    [r["test"]["per_ticket"] for r in by_key[key]], [r["test"]["per_ticket"] for r in ref]
                ),
            }
    ceiling = None
    if "unchanged" in by_key:
        bare = by_key["unchanged"][0]["test"]
        ceiling = {"bare": f"{bare['correct']}/{bare['total']}"}
        for kind, keys in CEILINGS:
            key = next((k for k in keys if k in by_key), None)
            if key is None:
                continue
            test = by_key[key][0]["test"]
            ceiling[kind] = {
                "arm": key,
                "score": f"{test['correct']}/{test['total']}",
                "gap_points": 100 * (test["score"] - bare["score"]),
                "mcnemar": mcnemar(test["per_ticket"], bare["per_ticket"]),
            }
        if len(ceiling) == 1:
            ceiling = None
    return {"arms": arms, "ceiling": ceiling}


REFERENCE_NAMES = {"unchanged": "unchanged", "gepa": "GEPA", "mipro-demos": "MIPROv2 with demos"}


def summary_tables(summary: dict) -> str:
    arms, parts = summary["arms"], []
    order = [k for k in ARMS if k in arms]
    cells = []
    for key in order:
        a = arms[key]
        seeds = ",".join(str(s) for s in a["seeds"]) if ARMS[key].seeded else "-"
        calls = _pm(a["metric_calls"]) + ("" if a.get("metric_calls_are_runs") else "*")
        if a.get("unparsed_runs") and a["unparsed_runs"]["mean"]:
            calls += f" ({a['unparsed_runs']['mean']:.1f} unparsed)"
        cells.append(
            (
                a["name"],
                seeds,
                f"{_pm(a['accuracy'])}% ({', '.join(a['per_seed_correct'])})",
                calls,
                f"{fmt_tokens(a['optimizer_tokens_in']['mean'])} / {fmt_tokens(a['optimizer_tokens_out']['mean'])}"
                + (f" (± {fmt_tokens(a['optimizer_tokens']['sd'])})" if a["optimizer_tokens"]["n"] > 1 else ""),
                f"{a['tokens_vs_gepa']:.2f}x" if "tokens_vs_gepa" in a else "",
                f"{_pm(a['wall_min'])} min",
                f"{a['wall_vs_gepa']:.2f}x" if "wall_vs_gepa" in a else "",
                f"{a['load_1min_mean']['mean']:.1f}",
            )
        )
    parts.append(
        markdown(
            (
                "arm",
                "seeds",
                "test accuracy, mean ± sd (per seed)",
                "metric calls (program runs)",
                "optimizer tokens in / out (± sd of total)",
                "tokens ÷ GEPA",
                "wall time",
                "wall ÷ GEPA",
                "load (1-min avg)",
            ),
            cells,
        )
    )
    if any(not a.get("metric_calls_are_runs", True) for a in arms.values()):
        parts.append(
            "\\* from arm files written before program runs were counted: metric-function calls, which miss the "
            "runs whose output did not parse."
        )

    def paired(c: dict | None) -> tuple[str, str]:
        if not c:
            return "", ""
        seeds = "; ".join(
            ("" if m["seed"] is None else f"s{m['seed']}: ") + f"+{m['wins']}/-{m['losses']} p={m['p']:.2f}"
            for m in c["mcnemar_per_seed"]
        )
        s = c["sign_test_pooled"]
        return seeds, f"+{s['better']}/-{s['worse']} ({s['ties']} tied) p={s['p']:.2f}"

    refs = [r for r in REFERENCES if r in arms]
    cells = []
    for key in order:
        if key == "unchanged":
            continue
        a = arms[key]
        cells.append((a["name"], *(cell for ref in refs for cell in paired(a.get(f"vs_{ref}")))))
    if cells and refs:
        header = ["arm"]
        for ref in refs:
            name = REFERENCE_NAMES.get(ref, ref)
            same = " (same seed)" if ARMS[ref].seeded else " (tickets won/lost)"
            header += [f"vs {name}: McNemar per seed{same}", f"vs {name}: sign test, seeds pooled"]
        parts.append(markdown(tuple(header), cells))
    if summary["ceiling"]:
        c = summary["ceiling"]
        lines = [f"Ceilings: the unchanged program scored {c['bare']} with the bare instruction"]
        described = {
            "instruction": "with the best known instruction",
            "demos": "with the bare instruction and the task's hand-picked train demos",
        }
        for kind in ("instruction", "demos"):
            if kind in c:
                k, m = c[kind], c[kind]["mcnemar"]
                lines.append(
                    f"{k['score']} {described[kind]} ({k['gap_points']:+.1f} points; won {m['wins']} tickets and "
                    f"lost {m['losses']}, McNemar p={m['p']:.3f})"
                )
        parts.append("; ".join(lines) + ".")
    return "\n\n".join(parts)


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def load_arm_files(arms_dir: Path, settings: dict) -> dict[str, dict]:
    """{label: row} for every arm file already in ``arms_dir``; refuses one written with other settings."""
    rows = {}
    for path in sorted(arms_dir.glob("*.json")):
        if path.name.endswith(".failed.json"):  # kept for reading; the arm runs again
            continue
        row = json.loads(path.read_text())
        if row.get("key") not in ARMS:
            continue
        check_settings(row, settings, path)
        rows[row["label"]] = row
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    work_dir = Path(args.work_dir)
    out_dir = Path(args.out) if args.out else work_dir / "results" / stamp.strftime("%Y%m%dT%H%M%SZ")
    arms_dir = out_dir / "arms"
    arms_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(out_dir / "run.log")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    task = load_task(args.task)
    options = program_options(task, args)
    train, val, test = task.load()
    train, val, test = train[: args.limit_train], val[: args.limit_val], test[: args.limit_test]
    settings = comparable_settings(args, args.task, options, (train, val, test))
    log.info(
        "task %s %s: %d train, %d val, %d test; output in %s",
        args.task,
        options or "(default settings)",
        len(train),
        len(val),
        len(test),
        out_dir,
    )
    import rlmoptimizer

    library = {
        "commit": os.environ.get("RLMOPT_BENCH_COMMIT"),
        "requested": args.rlm_commit,
        "path": str(Path(rlmoptimizer.__file__).parent),
    }
    log.info("rlmoptimizer from %s (commit %s)", library["path"], library["commit"] or "unknown: not run by run.sh")

    done = load_arm_files(arms_dir, settings)
    plan = plan_runs(args.arms, args.seed_list)  # seed by seed: a stopped run leaves matched pairs
    todo = [(key, seed) for key, seed in plan if arm_label(key, seed) not in done]
    log.info(
        "arms: %s; already done in %s: %s", ", ".join(arm_label(*a) for a in plan), arms_dir, ", ".join(done) or "none"
    )

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    needs_local = LOCAL in (args.task_model, args.optimizer_model)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "date": stamp.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "task": args.task,
        "program_options": options,
        "split_sizes": {"train": len(train), "val": len(val), "test": len(test)},
        "models": {
            "task": args.task_model,
            "optimizer": args.optimizer_model,
            "local_model": args.local_model if needs_local else None,
        },
        "rlmoptimizer": library,
        "settings": {**vars(args), "api_key": "(set)" if args.api_key else None},
        "cache": "dspy cache disabled (memory and disk) and cache=False on every LM",
    }
    scored: dict[str, tuple[str, dict]] = {}
    for label, row in done.items():
        if row["status"] == "ok" and "per_ticket" in row.get("test", {}):
            scored.setdefault(prompt_key(row), (label, row["test"]))
    if todo or args.setup_only:
        with ExitStack() as stack, LoadSampler() as loads:
            # The unchanged program and the policy instruction need no optimizer LM, nor its server.
            optimizing = args.setup_only or any(ARMS[key].seeded for key, _ in todo)
            servers = start_servers(args, stack, work_dir, out_dir, results, optimizer=optimizing)
            if args.setup_only:
                log.info("setup done: the model is in place and the server answered")
                write_json(out_dir / "results.json", results)
                return 0
            meters = {"task": Meter("task"), "optimizer": Meter("optimizer")}
            lm_options = {"api_base": args.api_base, "api_key": args.api_key}
            task_lm = make_lm(
                args.task_model,
                meters["task"],
                server=servers.get("task"),
                max_tokens=args.task_max_tokens,
                temperature=args.task_temperature,
                **lm_options,
            )
            optimizer_lm = (
                make_lm(
                    args.optimizer_model,
                    meters["optimizer"],
                    server=servers.get("optimizer"),
                    max_tokens=args.optimizer_max_tokens,
                    temperature=args.optimizer_temperature,
                    **lm_options,
                )
                if optimizing
                else None
            )
            # Every run of the task's program, in any thread and through any optimizer, is counted (metering.py).
            runs = ProgramRuns(type(make_program(task, args)))
            dspy.configure(lm=task_lm, callbacks=[*dspy.settings.get("callbacks", []), runs])
            for key, seed in todo:
                row = run_arm(
                    key,
                    seed,
                    args,
                    task,
                    (train, val, test),
                    task_lm,
                    optimizer_lm,
                    meters,
                    out_dir,
                    scored,
                    settings,
                    loads,
                    runs,
                )
                row["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
                if row["status"] == "ok":  # a failed arm is not saved, so the next invocation tries it again
                    write_json(arms_dir / f"{row['label']}.json", row)
                else:
                    write_json(arms_dir / f"{row['label']}.failed.json", row)
                done[row["label"]] = row
    results["total_wall_s"] = round(time.perf_counter() - started, 1)

    order = {key: i for i, key in enumerate(ARMS)}
    rows = sorted(done.values(), key=lambda r: (order.get(r["key"], 99), r["seed"] if r["seed"] is not None else -1))
    results["rows"] = rows
    results["summary_stats"] = summarize(rows)
    models = {"task": args.task_model, "optimizer": args.optimizer_model}
    missing = [
        arm_label(k, s) for k, s in plan if arm_label(k, s) not in done or done[arm_label(k, s)]["status"] != "ok"
    ]
    head = (
        f"{stamp:%Y-%m-%d}, task LM {describe_model(args.task_model, args)}, optimizer LM "
        f"{describe_model(args.optimizer_model, args)}, program {options or 'default settings'}, budget "
        f"{args.budget} metric calls, {len(train)}/{len(val)}/{len(test)} train/val/test, "
        f"{results['machine']['nproc']} cores ({results['machine']['cpu']}), rlmoptimizer commit(s) "
        f"{', '.join(sorted({r.get('rlm_commit') or '?' for r in rows if r['key'].startswith('rlmoptimizer')})) or '-'}"
        + (f"; MISSING (not finished): {', '.join(missing)}" if missing else "")
    )
    table = (
        summary_tables(results["summary_stats"]) + "\n\nEach run (dollars at litellm's price for each hosted "
        f"model{', the local model at ' + args.price_as + chr(39) + 's' if needs_local else ''}):\n\n"
        + markdown_table(rows, models, args.price_as)
    )
    estimated = estimate_rows(rows)
    if estimated:
        table += (
            "\n\nThe cost estimate made before each compile (no LM call; `optimizer.estimate`), beside what the run "
            "spent:\n\n" + markdown(ESTIMATE_HEADER, estimated)
        )
    results["summary"] = head
    (out_dir / "table.md").write_text(head + "\n\n" + table + "\n")
    write_json(out_dir / "results.json", results)
    print("\n" + head + "\n\n" + table + "\n")
    print(f"results: {out_dir / 'results.json'}")
    return 0


def start_servers(
    args, stack: ExitStack, work_dir: Path, out_dir: Path, results: dict, *, optimizer: bool = True
) -> dict:
    """{role: Server} for each role whose model is local (the optimizer's only when ``optimizer``); each server
    is stopped when ``stack`` closes."""
    local_roles = [
        role
        for role, model in (("task", args.task_model), ("optimizer", args.optimizer_model))
        if model == LOCAL and (optimizer or role == "task")
    ]
    if not local_roles:
        return {}
    model_path = ensure_weights(WEIGHTS[args.local_model], work_dir)
    servers: dict = {}
    if args.one_server and len(local_roles) == 2:
        plan = [(("task", "optimizer"), max(args.n_ctx, args.task_n_ctx))]
    else:
        plan = [((role,), args.task_n_ctx if role == "task" else args.n_ctx) for role in local_roles]
    results["servers"] = {}
    for roles, n_ctx in plan:
        name = "+".join(roles)
        server = stack.enter_context(
            llama_server(
                model_path,
                args.local_model,
                n_ctx=n_ctx,
                n_threads=args.server_threads,
                log_path=out_dir / f"server-{name}.log",
            )
        )
        results["servers"][name] = {
            "startup_s": round(server.startup_s, 1),
            "check_s": round(server.check_s, 2),
            "n_ctx": n_ctx,
            "n_threads": args.server_threads,
            "model_file": str(model_path),
        }
        servers.update(dict.fromkeys(roles, server))
    return servers


def describe_model(model: str, args) -> str:
    return f"{args.local_model} (llama.cpp, local)" if model == LOCAL else model


def setup_logging(log_file: Path) -> None:
    """Our progress on the console; everything (dspy, GEPA, MIPROv2 included) in ``run.log``."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file_handler)
    console = logging.StreamHandler()
    console.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(console)
    for name in ("LiteLLM", "litellm", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log.error("interrupted; the servers are stopped, and results.json holds the arms that finished")
        logging.shutdown()
        # Not sys.exit: that would wait for evaluation threads still retrying against the stopped servers.
        os._exit(130)
