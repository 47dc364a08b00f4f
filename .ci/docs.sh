#!/usr/bin/env bash
# CI for the docs: the site builds with no warning (mkdocs build --strict: broken links, missing pages, docstrings
# griffe cannot read); its pages read as written in a headless Chromium (.ci/check_pages.py: what --strict cannot
# see); and the quick-start notebook, committed with its outputs, runs top to bottom, offline (.ci/notebook.py).
# Run from the repository root in an activated virtual environment with the project installed.
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet -e ".[docs,plot]"  # plot: the notebook shows the picture of its run
python -c "import mkdocs, material, mkdocstrings_handlers.python, nbclient, nbformat, ipykernel, matplotlib" 2>/dev/null || {
    echo "docs: the docs and plot extras did not install mkdocs-material, mkdocstrings[python], nbclient, nbformat, ipykernel and matplotlib" >&2
    exit 1
}
export NO_MKDOCS_2_WARNING=1  # mkdocs-material's notice about its successor, not about this site

SITE_DIR="$(mktemp -d -t rlmoptimizer-site-XXXXXX)"
trap 'rm -rf "$SITE_DIR"' EXIT
mkdocs build --strict --site-dir "$SITE_DIR"
echo "docs: the site built with --strict ($(find "$SITE_DIR" -name '*.html' | wc -l) pages)"

# The pages in a headless browser: Debian's Chromium, installed here when missing and this is a root shell with apt.
chromium_found() { command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "${CHROMIUM:-}" ]; }
if ! chromium_found && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "docs: installing Debian's chromium for the page checks"
    apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
fi
if chromium_found; then
    python .ci/check_pages.py --site "$SITE_DIR"
elif [ -n "${CI:-}" ]; then
    echo "docs: no Chromium for the page checks: apt-get install -y chromium (or set CHROMIUM)" >&2
    exit 1
else
    echo "docs: page checks skipped: no Chromium (apt-get install -y chromium, or set CHROMIUM)" >&2
fi

python .ci/notebook.py
