#!/bin/sh
# How the image installs inflight (Dockerfile, runtime stage); tests/test_wheel.py runs this
# same script into a fresh virtualenv, so the extras and constraints the image installs are
# the ones the tests prove.
#
#   deploy/install.sh WHEEL_DIR [EXTRAS]     # EXTRAS: all (default), worker, api, jobs, ...
#
# Installs the one inflight wheel in WHEEL_DIR with EXTRAS, held to the exact versions of
# constraints.txt (at the root beside deploy/). PYTHON picks the interpreter (default:
# python); pip's own environment (PIP_NO_INDEX, PIP_FIND_LINKS, ...) applies.
set -eu
wheel_dir=$1
extras=${2:-all}
root=$(cd "$(dirname "$0")/.." && pwd)
set -- "$wheel_dir"/inflight-*.whl
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
    echo "deploy/install.sh: expected exactly one inflight-*.whl in $wheel_dir" >&2
    exit 2
fi
exec "${PYTHON:-python}" -m pip install --constraint "$root/constraints.txt" "$1[$extras]"
