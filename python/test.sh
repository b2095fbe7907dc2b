#!/usr/bin/env bash
# Builds switchyard's Python package into a virtual environment outside the
# repository and runs its tests (python/tests) there, with numpy, pytest,
# onnxruntime and torch (for the torch.compile backend) installed beside it.
#
#   SWITCHYARD_VENV   the environment (default: $XDG_CACHE_HOME/switchyard/python-venv)
#   PYTHON            the interpreter that makes it (default: python3)
#
# Exit status 3: no Python environment could be made here (no interpreter, no
# venv module, or no package index to install maturin and pytest from); the
# reason is printed. Any other failure is the build's or the tests'.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SWITCHYARD_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/python-venv}"
python="${PYTHON:-python3}"

unavailable() { echo "python tests: $1" >&2; exit 3; }

command -v "$python" >/dev/null || unavailable "no $python on the PATH"
if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv" || unavailable "$python -m venv $venv failed"
fi
if ! "$venv/bin/python" -c "import maturin, pytest, numpy" 2>/dev/null \
    && ! "$venv/bin/python" -m pip install --quiet "maturin>=1.5,<2" pytest "numpy>=1.22"; then
    unavailable "could not install maturin, pytest and numpy into $venv"
fi
# The tests compare with onnxruntime where it can be installed.
"$venv/bin/python" -c "import onnxruntime" 2>/dev/null \
    || "$venv/bin/python" -m pip install --quiet onnxruntime \
    || echo "python tests: onnxruntime could not be installed; comparing with expected outputs only" >&2

# The torch.compile backend's tests need torch; where the checks require the
# Python tests (SWITCHYARD_REQUIRE_PYTHON=1), they require torch too.
if ! "$venv/bin/python" -c "import torch" 2>/dev/null \
    && ! "$venv/bin/python" -m pip install --quiet "torch>=2.4"; then
    if [ "${SWITCHYARD_REQUIRE_PYTHON:-}" = 1 ]; then
        echo "python tests: torch could not be installed into $venv, and SWITCHYARD_REQUIRE_PYTHON=1 requires it" >&2
        exit 1
    fi
    echo "python tests: torch could not be installed; the torch.compile backend's tests skip" >&2
fi
if [ "${SWITCHYARD_REQUIRE_PYTHON:-}" = 1 ]; then
    export SWITCHYARD_REQUIRE_TORCH=1
fi

# Its own target folder: a `cargo test` running this holds the main one.
export CARGO_TARGET_DIR="${SWITCHYARD_PYTHON_TARGET:-$repo/target/python}"
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
"$venv/bin/maturin" build --quiet --profile dev --manifest-path "$repo/python/Cargo.toml" \
    --interpreter "$venv/bin/python" --out "$wheels"
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheels"/*.whl
cd "$repo"
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs python/tests "$@"
