"""Compare the unchanged program, rlmoptimizer, GEPA and MIPROv2 on one task with real models.

Run it through ``bash benchmarks/real_models/run.sh [flags]``, which installs what it needs first; see
``benchmarks/README.md``. With the default ``--task-model local --optimizer-model local`` this assembles the
GGUF model, starts llama-cpp-python servers on 127.0.0.1 (one per role: the task LM's and the optimizer LM's),
checks that they answer, runs every arm and stops the servers at the end, also on an error, Ctrl-C or SIGTERM.

Two servers of the same model file rather than one: a server keeps one prompt's KV cache per slot, and on 2
cores one slot is fastest. Sharing it, every task-LM evaluation would evict the optimizer's long prompt (an
agent's growing history, MIPROv2's proposer context) and the next optimizer call would re-read all of it. The
two rarely compute at once (an optimizer waits for its evaluations), so they do not compete for the cores.

Every arm gets a fresh copy of the task's program, the same train/val data, the same task LM, the same
optimizer LM and the same budget of B metric calls; every resulting program is scored on the test split
with the task LM. DSPy's cache is off (memory and disk, and ``cache=False`` on each LM), so no arm reuses
another's answers and every arm pays for its own calls.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
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
from arms import ARMS, ArmContext, Unavailable, instructions_of  # noqa: E402
from local_model import DEFAULT_WEIGHTS, WEIGHTS, ensure_weights, llama_server  # noqa: E402
from metering import CountingMetric, Meter, MeteredLM  # noqa: E402

log = logging.getLogger("bench")
_interrupted = threading.Event()


def _interrupt(signum, frame) -> None:
    """Ctrl-C, SIGTERM and SIGHUP all become KeyboardInterrupt in the main thread, so every ``finally`` (the
    servers' included) runs and dspy's parallel evaluation cancels its pending examples. The flag survives
    dspy turning the interrupt into ``Exception("Execution cancelled ...")``, which ``run_arm`` re-raises."""
    _interrupted.set()
    signal.default_int_handler(signum, frame)
LOCAL = "local"
DEFAULT_TASK = HERE / "tasks" / "ticket_routing.py"
DEFAULT_ARMS = "unchanged,rlmoptimizer,gepa,mipro"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("task and budget")
    g.add_argument("--task", default=str(DEFAULT_TASK),
                   help="a task: path to a .py file or a dotted module exposing load(), make_program(), metric()")
    g.add_argument("--budget", type=int, default=80, help="B, metric calls per optimizer")
    g.add_argument("--optimizers", default=DEFAULT_ARMS, help=f"comma-separated subset of {DEFAULT_ARMS}")
    g.add_argument("--limit-train", type=int, default=20,
                   help="use only the first N training examples (0: all; the default task has 40)")
    g.add_argument("--limit-val", type=int, default=20,
                   help="use only the first N validation examples (0: all; the default task has 30)")
    g.add_argument("--limit-test", type=int, default=40,
                   help="use only the first N test examples (0: all; the default task has 60)")
    g.add_argument("--num-threads", type=int, default=2, help="evaluation threads for every optimizer and the test")
    g.add_argument("--seed", type=int, default=0)

    g = p.add_argument_group("models ('local' = the GGUF model on a llama.cpp server started here)")
    g.add_argument("--task-model", default=LOCAL, help="task LM, e.g. openai/gpt-4o-mini (a litellm model name)")
    g.add_argument("--optimizer-model", default=LOCAL, help="optimizer LM for all three optimizers, e.g. openai/gpt-4o")
    g.add_argument("--api-base", help="API base URL for hosted models (default: the provider's)")
    g.add_argument("--api-key", help="API key for hosted models (default: the provider's environment variable)")
    g.add_argument("--task-max-tokens", type=int, default=256)
    g.add_argument("--task-temperature", type=float, default=0.0)
    g.add_argument("--optimizer-max-tokens", type=int, default=1024)
    g.add_argument("--price-as", default="openai/gpt-4o-mini",
                   help="the hosted model (litellm name) whose price the table's dollar columns use for the local model")
    g.add_argument("--optimizer-temperature", type=float, default=0.7)

    g = p.add_argument_group("local server")
    g.add_argument("--local-model", default=DEFAULT_WEIGHTS, choices=sorted(WEIGHTS))
    g.add_argument("--n-ctx", type=int, default=8192, help="context window of the optimizer LM's server")
    g.add_argument("--task-n-ctx", type=int, default=4096, help="context window of the task LM's server")
    g.add_argument("--server-threads", type=int, default=len(os.sched_getaffinity(0)))
    g.add_argument("--one-server", action="store_true",
                   help="serve both roles from one server (less memory, slower optimizer calls)")
    g.add_argument("--setup-only", action="store_true",
                   help="assemble the model, start the server, check it answers, stop it; run nothing")

    g = p.add_argument_group("optimizer settings")
    g.add_argument("--mipro-candidates", type=int, default=4, help="MIPROv2 num_candidates (instructions proposed)")
    g.add_argument("--mipro-minibatch-size", type=int, default=5)
    g.add_argument("--mipro-full-eval-steps", type=int, default=5)
    g.add_argument("--rlm-max-turns", type=int, default=12, help="rlmoptimizer rlm_max_iterations (agent turns)")
    g.add_argument("--rlm-max-llm-calls", type=int, default=10, help="rlmoptimizer rlm_max_llm_calls")

    g = p.add_argument_group("output")
    g.add_argument("--work-dir", default=str(REPO / "benchmarks" / ".work"))
    g.add_argument("--out", help="output folder (default: <work-dir>/results/<UTC timestamp>)")
    args = p.parse_args(argv)
    unknown = [a for a in args.optimizers.split(",") if a not in ARMS]
    if unknown:
        p.error(f"--optimizers: unknown {unknown}; choose from {sorted(ARMS)}")
    if args.budget < 1:
        p.error(f"--budget must be >= 1, got {args.budget}")
    for flag in ("limit_train", "limit_val", "limit_test"):
        value = getattr(args, flag)
        if value < 0:
            p.error(f"--{flag.replace('_', '-')} must be >= 0 (0: the whole split), got {value}")
        setattr(args, flag, value or None)
    return args


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
        raise SystemExit(f"--task {spec}: the module lacks {missing}; a task exposes load() -> (train, val, test), "
                         "make_program() -> dspy.Module and metric(example, pred, trace=None, pred_name=None, "
                         "pred_trace=None)")
    return module


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    mem_gb = None
    try:
        kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")))
        mem_gb = round(kb / 1024 / 1024, 1)
    except (OSError, StopIteration, ValueError):
        pass
    versions = {}
    for package in ("dspy", "gepa", "optuna", "litellm", "llama_cpp_python", "rlmoptimizer"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {"nproc": len(os.sched_getaffinity(0)), "cpu": cpu, "memory_gb": mem_gb, "platform": platform.platform(),
            "python": platform.python_version(), "versions": versions}


def make_lm(model: str, meter: Meter, *, server, api_base, api_key, max_tokens: int, temperature: float) -> MeteredLM:
    if model == LOCAL:
        name, api_base, api_key = f"openai/{server.alias}", server.api_base, "local"
    else:
        name = model
    extra = {k: v for k, v in (("api_base", api_base), ("api_key", api_key)) if v}
    # engine="litellm": dspy 3.4.1's default engine sends max_completion_tokens, which llama.cpp ignores.
    return MeteredLM(name, meter=meter, engine="litellm", cache=False, max_tokens=max_tokens,
                     temperature=temperature, num_retries=2, **extra)


def _optimizer_window(args) -> int | None:
    """The optimizer LM's context window when it is served here (litellm knows none for the local model)."""
    if args.optimizer_model != LOCAL:
        return None
    return max(args.n_ctx, args.task_n_ctx) if args.one_server else args.n_ctx


def run_arm(key: str, args, task, data, task_lm, optimizer_lm, meters, out_dir: Path,
            scored: dict[str, tuple[str, dict]]) -> dict[str, Any]:
    """One arm: optimize, then score on test. Failures become the row's status; only Ctrl-C stops the run.

    ``scored`` maps the instructions of every program scored so far to (arm, test result): a program whose
    instructions were already scored (an optimizer that returned the unchanged program) reuses that score
    instead of paying for the same test run again (the task LM runs at temperature 0 by default)."""
    arm = ARMS[key]
    train, val, test = data
    metric = CountingMetric(task.metric, as_float=arm.metric_as_float)
    ctx = ArmContext(
        program=task.make_program(), train=train, val=val, task_lm=task_lm, optimizer_lm=optimizer_lm,
        metric=metric, budget=args.budget, num_threads=args.num_threads, seed=args.seed, out_dir=out_dir,
        options={"mipro_candidates": args.mipro_candidates, "mipro_minibatch_size": args.mipro_minibatch_size,
                 "mipro_full_eval_steps": args.mipro_full_eval_steps, "rlm_max_turns": args.rlm_max_turns,
                 "rlm_max_llm_calls": args.rlm_max_llm_calls, "root_context_window": _optimizer_window(args)},
    )
    row: dict[str, Any] = {"arm": arm.name, "key": key, "status": "ok", "error": None, "details": {}}
    log.info("=== %s: optimizing (budget %d metric calls) ===", arm.name, args.budget)
    before = {role: meter.snapshot() for role, meter in meters.items()}
    started = time.perf_counter()
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
    row["optimize"] = {
        "wall_s": round(time.perf_counter() - started, 1),
        "metric_calls": metric.scored,
        "feedback_calls": metric.feedback,
        **{f"{role}_lm": (meter.snapshot() - before[role]).to_dict() for role, meter in meters.items()},
    }
    if row["status"] != "ok":
        log.warning("%s: %s: %s", arm.name, row["status"], row["error"])
        return row
    row["instructions"] = instructions_of(program)
    same = json.dumps(row["instructions"], sort_keys=True)
    if same in scored and args.task_temperature == 0:
        earlier, row["test"] = scored[same]
        row["test"] = {**row["test"], "same_instructions_as": earlier}
        log.info("%s: optimized in %.0f s with %d metric calls; same instructions as %s: test score %.1f%% reused",
                 arm.name, row["optimize"]["wall_s"], metric.scored, earlier, 100 * row["test"]["score"])
        return row
    log.info("%s: optimized in %.0f s with %d metric calls; scoring on %d test examples", arm.name,
             row["optimize"]["wall_s"], metric.scored, len(test))
    try:
        row["test"] = evaluate(program, test, task, task_lm, meters["task"], args.num_threads)
    except Exception as e:  # e.g. the server died: the row says so, the next arm still runs
        if _interrupted.is_set():
            raise KeyboardInterrupt from e
        row["status"], row["error"] = "error", f"test evaluation failed: {type(e).__name__}: {e}"
        row["traceback"] = traceback.format_exc()
        return row
    log.info("%s: test score %.1f%% (%d/%d) in %.0f s", arm.name, 100 * row["test"]["score"], row["test"]["correct"],
             row["test"]["total"], row["test"]["wall_s"])
    scored[same] = (arm.name, row["test"])
    return row


def evaluate(program, test, task, task_lm, task_meter: Meter, num_threads: int) -> dict[str, Any]:
    metric = CountingMetric(task.metric, as_float=True)
    before = task_meter.snapshot()
    started = time.perf_counter()
    with dspy.context(lm=task_lm):
        result = dspy.Evaluate(devset=test, metric=metric, num_threads=num_threads, display_progress=False,
                               max_errors=len(test) + 1, provide_traceback=False)(program)
    correct = sum(float(score) for *_, score in result.results)
    return {"score": correct / len(test), "correct": int(round(correct)), "total": len(test),
            "wall_s": round(time.perf_counter() - started, 1), "task_lm": (task_meter.snapshot() - before).to_dict()}


def fmt_tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


TABLE_HEADER = ("optimizer", "test score", "metric calls", "task-LM calls", "task tokens in/out",
                "optimizer-LM calls", "optimizer tokens in/out", "task $", "optimizer $", "wall time")


def dollars(model: str, price_as: str, usage: dict[str, Any]) -> str:
    """The dollars of ``usage`` (input/output token totals) at litellm's price for ``model``, or, for the local
    model (no price), at ``price_as``'s; "?" when neither is priced."""
    from rlmoptimizer.usage import price_of_call

    cost = price_of_call(model, usage["input_tokens"], usage["output_tokens"]) if model != LOCAL else None
    if cost is None:
        cost = price_of_call(price_as, usage["input_tokens"], usage["output_tokens"])
    return "?" if cost is None else f"{float(cost):.4f}"


def table_rows(rows: list[dict], models: dict[str, str] | None = None, price_as: str = "openai/gpt-4o-mini",
               ) -> list[tuple[str, ...]]:
    models = models or {"task": LOCAL, "optimizer": LOCAL}
    out = []
    for row in rows:
        if row["status"] != "ok":
            out.append((row["arm"], f"{row['status']}: {row['error']}"[:120], *[""] * (len(TABLE_HEADER) - 2)))
            continue
        o, t = row["optimize"], row["test"]
        same = f" (same instructions as {t['same_instructions_as']})" if t.get("same_instructions_as") else ""
        out.append((
            row["arm"], f"{100 * t['score']:.1f}% ({t['correct']}/{t['total']}){same}", str(o["metric_calls"]),
            str(o["task_lm"]["calls"]),
            f"{fmt_tokens(o['task_lm']['input_tokens'])} / {fmt_tokens(o['task_lm']['output_tokens'])}",
            str(o["optimizer_lm"]["calls"]),
            f"{fmt_tokens(o['optimizer_lm']['input_tokens'])} / {fmt_tokens(o['optimizer_lm']['output_tokens'])}",
            dollars(models["task"], price_as, o["task_lm"]), dollars(models["optimizer"], price_as, o["optimizer_lm"]),
            f"{o['wall_s'] / 60:.1f} min",
        ))
    return out


def markdown_table(rows: list[dict], models: dict[str, str] | None = None, price_as: str = "openai/gpt-4o-mini") -> str:
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows, models, price_as)]
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    work_dir = Path(args.work_dir)
    out_dir = Path(args.out) if args.out else work_dir / "results" / stamp.strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(out_dir / "run.log")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    task = load_task(args.task)
    train, val, test = task.load()
    train, val, test = train[: args.limit_train], val[: args.limit_val], test[: args.limit_test]
    log.info("task %s: %d train, %d val, %d test; output in %s", args.task, len(train), len(val), len(test), out_dir)

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    needs_local = LOCAL in (args.task_model, args.optimizer_model)
    started = time.perf_counter()
    rows: list[dict] = []
    results: dict[str, Any] = {
        "date": stamp.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "task": args.task,
        "split_sizes": {"train": len(train), "val": len(val), "test": len(test)},
        "models": {"task": args.task_model, "optimizer": args.optimizer_model,
                   "local_model": args.local_model if needs_local else None},
        "settings": {**vars(args), "api_key": "(set)" if args.api_key else None},
        "cache": "dspy cache disabled (memory and disk) and cache=False on every LM",
        "rows": rows,
    }
    with ExitStack() as stack:
        servers = start_servers(args, stack, work_dir, out_dir, results)
        if args.setup_only:
            log.info("setup done: the model is in place and the server answered")
            write_json(out_dir / "results.json", results)
            return 0
        meters = {"task": Meter("task"), "optimizer": Meter("optimizer")}
        lm_options = {"api_base": args.api_base, "api_key": args.api_key}
        task_lm = make_lm(args.task_model, meters["task"], server=servers.get("task"),
                          max_tokens=args.task_max_tokens, temperature=args.task_temperature, **lm_options)
        optimizer_lm = make_lm(args.optimizer_model, meters["optimizer"], server=servers.get("optimizer"),
                               max_tokens=args.optimizer_max_tokens, temperature=args.optimizer_temperature,
                               **lm_options)
        dspy.configure(lm=task_lm)
        scored: dict[str, tuple[str, dict]] = {}
        for key in args.optimizers.split(","):
            rows.append(run_arm(key, args, task, (train, val, test), task_lm, optimizer_lm, meters, out_dir, scored))
            results["total_wall_s"] = round(time.perf_counter() - started, 1)
            write_json(out_dir / "results.json", results)

    table = markdown_table(rows, {"task": args.task_model, "optimizer": args.optimizer_model}, args.price_as)
    (out_dir / "table.md").write_text(table + "\n")
    summary = (f"{stamp:%Y-%m-%d}, task LM {describe_model(args.task_model, args)}, optimizer LM "
               f"{describe_model(args.optimizer_model, args)}, budget {args.budget} metric calls, "
               f"{len(train)}/{len(val)}/{len(test)} train/val/test, {results['machine']['nproc']} cores "
               f"({results['machine']['cpu']}), total {results['total_wall_s'] / 60:.1f} min; dollars at litellm's "
               f"price for each hosted model" + (f", the local model's tokens at {args.price_as}'s"
                                                 if LOCAL in (args.task_model, args.optimizer_model) else ""))
    results["summary"] = summary
    write_json(out_dir / "results.json", results)
    print("\n" + summary + "\n\n" + table + "\n")
    print(f"results: {out_dir / 'results.json'}")
    return 0


def start_servers(args, stack: ExitStack, work_dir: Path, out_dir: Path, results: dict) -> dict:
    """{role: Server} for each role whose model is local; each server is stopped when ``stack`` closes."""
    local_roles = [role for role, model in (("task", args.task_model), ("optimizer", args.optimizer_model))
                   if model == LOCAL]
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
        server = stack.enter_context(llama_server(model_path, args.local_model, n_ctx=n_ctx,
                                                  n_threads=args.server_threads,
                                                  log_path=out_dir / f"server-{name}.log"))
        results["servers"][name] = {"startup_s": round(server.startup_s, 1), "check_s": round(server.check_s, 2),
                                    "n_ctx": n_ctx, "n_threads": args.server_threads, "model_file": str(model_path)}
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
