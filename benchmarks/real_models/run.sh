#!/usr/bin/env bash
# One command for the real-model benchmark: set up what it needs, then run the comparison.
#
#   bash benchmarks/real_models/run.sh [run.py flags]      # e.g. --budget 120 --limit-test 20
#   bash benchmarks/real_models/run.sh --setup-only        # build and assemble, run nothing
#   bash benchmarks/real_models/run.sh --help              # the flags, at once: nothing is set up or built
#
# Setup (each step is skipped when its result is already there, all under benchmarks/.work/):
#   0. the library under test at a fixed commit (--rlm-commit, default HEAD when the run starts): a git worktree
#      of that commit in benchmarks/.work/rlm-<commit>, first on PYTHONPATH, so edits to the working tree during
#      a run change nothing; the commit goes to every arm's result (RLMOPT_BENCH_COMMIT),
#   1. a venv in benchmarks/.work/venv with the library's dependencies (pip install of the worktree, then the
#      library itself uninstalled so the worktree is what imports), plus optuna for MIPROv2; done again only when
#      the worktree's pyproject.toml differs from the last one installed (a stamp in the venv), an import fails,
#      or the library itself is found installed in the venv,
#   2. llama-cpp-python[server]==0.3.36 built once into a wheel cached in benchmarks/.work/wheels
#      (compiled from source with -march=native, ~4-7 min on 2 cores; only for local models),
#   3. the GGUF weights assembled in benchmarks/.work/models and checked against their sha256
#      (done by run.py, which also starts, checks and stops the llama.cpp server).
# With --task-model/--optimizer-model naming hosted models (and no --local), steps 2-3 are skipped.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
WORK="${RLMOPT_BENCH_WORK:-$REPO/benchmarks/.work}"
VENV="$WORK/venv"
WHEELS="$WORK/wheels"
LLAMA_SPEC="llama-cpp-python[server]==0.3.36"
LLAMA_VERSION="0.3.36"
PYTHON="${PYTHON:-python3}"

log() { printf '[setup] %s\n' "$*" >&2; }

# --help answers at once, and a bad flag fails at once: cli.py imports only the standard library, so nothing is
# checked out, installed or built before the arguments are known to be good.
for arg in "$@"; do
    case "$arg" in
        -h | --help) exec "$PYTHON" "$HERE/cli.py" --help ;;
    esac
done
"$PYTHON" "$HERE/cli.py" "$@"

# Hosted-model runs do not need llama.cpp. A run needs it unless both model flags name a hosted model.
needs_local=1
task_model=""
opt_model=""
rlm_commit="HEAD"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --rlm-commit) rlm_commit="${args[$((i + 1))]:-}" ;;
        --rlm-commit=*) rlm_commit="${args[$i]#*=}" ;;
        --task-model) task_model="${args[$((i + 1))]:-}" ;;
        --task-model=*) task_model="${args[$i]#*=}" ;;
        --optimizer-model) opt_model="${args[$((i + 1))]:-}" ;;
        --optimizer-model=*) opt_model="${args[$i]#*=}" ;;
    esac
done
if [[ -n "$task_model" && "$task_model" != local* && -n "$opt_model" && "$opt_model" != local* ]]; then
    needs_local=0
fi

mkdir -p "$WORK" "$WHEELS"

# 0. The library under test, at a fixed commit.
commit="$(git -C "$REPO" rev-parse --verify "${rlm_commit}^{commit}")" || {
    log "--rlm-commit $rlm_commit: not a commit of $REPO"
    exit 1
}
TREE="$WORK/rlm-${commit:0:12}"
if [[ ! -f "$TREE/pyproject.toml" ]]; then
    log "checking out rlmoptimizer $commit into $TREE"
    git -C "$REPO" worktree prune
    git -C "$REPO" worktree add --detach "$TREE" "$commit" >/dev/null
fi
export RLMOPT_BENCH_COMMIT="$commit" RLMOPT_BENCH_WORKTREE="$TREE"
export PYTHONPATH="$TREE${PYTHONPATH:+:$PYTHONPATH}"

# 1. The venv with the library's dependencies (not the library: the worktree on PYTHONPATH is what imports).
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
PY="$VENV/bin/python"
# The dependencies are those of the worktree's pyproject.toml: installed once per distinct file, whatever the
# commit. The stamp names the file's hash.
deps_hash="$(sha256sum "$TREE/pyproject.toml" | cut -c1-16)"
STAMP="$VENV/.rlmoptimizer-deps-$deps_hash"
# Checks run from /, so that the current folder (first on sys.path with -c and -m) holds no rlmoptimizer nor its
# metadata. "Installed in the venv" is asked without PYTHONPATH: the worktree on it holds rlmoptimizer.egg-info
# once pip has built it there, and pip show would find that and have the venv reinstalled on every start.
installed_in_venv() { (cd / && env -u PYTHONPATH "$PY" -m pip show --quiet rlmoptimizer >/dev/null 2>&1); }
imports_ok() { (cd / && "$PY" -c "import dspy, optuna, rlmoptimizer" >/dev/null 2>&1); }
if [[ -f "$STAMP" ]] && imports_ok && ! installed_in_venv; then
    log "dependencies already installed in $VENV (pyproject.toml $deps_hash)"
else
    log "installing the dependencies of rlmoptimizer $commit into $VENV"
    nice -n 10 "$PY" -m pip install --quiet "$TREE" 2>"$WORK/pip-install.log" || {
        log "the library at $commit does not install; see $WORK/pip-install.log"
        exit 1
    }
    (cd / && env -u PYTHONPATH nice -n 10 "$PY" -m pip uninstall --quiet --yes rlmoptimizer)
    # MIPROv2 needs optuna, which dspy does not install.
    nice -n 10 "$PY" -m pip install --quiet optuna
    rm -f "$VENV"/.rlmoptimizer-deps-*
    touch "$STAMP"
fi
got="$(cd / && "$PY" -c "import rlmoptimizer, os; print(os.path.dirname(rlmoptimizer.__file__))")"
if [[ "$got" != "$TREE/rlmoptimizer" ]]; then
    log "rlmoptimizer imports from $got, not from $TREE"
    exit 1
fi
log "rlmoptimizer at $commit (from $TREE)"

# 2. llama-cpp-python, built once into a cached wheel (it is compiled for this machine's CPU).
if [[ "$needs_local" == 1 ]]; then
    if ! "$PY" -c "import llama_cpp, uvicorn, fastapi, sse_starlette, starlette_context, pydantic_settings" 2>/dev/null; then
        wheel="$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
        if [[ -z "$wheel" ]]; then
            log "building $LLAMA_SPEC into $WHEELS (compiles llama.cpp: about 4-7 minutes on 2 cores)"
            CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" nice -n 10 "$PY" -m pip wheel --no-deps \
                --wheel-dir "$WHEELS" "llama-cpp-python==$LLAMA_VERSION" >"$WORK/llama-build.log" 2>&1 || {
                log "the build failed; the last lines of $WORK/llama-build.log:"
                tail -n 30 "$WORK/llama-build.log" >&2
                exit 1
            }
            wheel="$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -n 1)"
        else
            log "reusing the cached wheel $wheel"
        fi
        # The wheel, plus the [server] extra's dependencies from PyPI.
        nice -n 10 "$PY" -m pip install --quiet "${wheel}[server]"
    fi
fi

exec "$PY" "$HERE/run.py" "$@"
