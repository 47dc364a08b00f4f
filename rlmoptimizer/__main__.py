"""Command line: ``python -m rlmoptimizer report RUN_DIR [--out PICTURE.png | --no-plot] [--all-runs]``."""

from __future__ import annotations

import argparse
import sys

from rlmoptimizer.errors import RLMOptimizerError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlmoptimizer", description="Tools for rlmoptimizer run directories."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser(
        "report",
        help="summarize a run directory (finished, interrupted or in flight) and draw its picture",
        description="Print a summary of a run directory (the run_storage_dir of a compile()) and write the picture "
        "of the run, score against budget spent, as a PNG (default: run.png inside the run directory).",
    )
    report.add_argument("run_dir", metavar="RUN_DIR", help="the run_storage_dir of a compile()")
    where = report.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="PNG", help="write the picture here instead of RUN_DIR/run.png")
    where.add_argument("--no-plot", action="store_true", help="print the summary only, write no picture")
    report.add_argument(
        "--all-runs",
        action="store_true",
        help="a row for every evaluation run (by default a run with more than 60 shows the first, the last and "
        "those the selection compared)",
    )
    args = parser.parse_args(argv)

    from rlmoptimizer.report.summary import report as print_report

    try:
        print_report(args.run_dir, picture=False if args.no_plot else (args.out or True), all_runs=args.all_runs)
    except RLMOptimizerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. the --out path cannot be written: say where else to write
        hint = "" if args.no_plot else ". Pass --out PATH.png to write the picture elsewhere, or --no-plot"
        print(f"error: {exc}{hint}.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
