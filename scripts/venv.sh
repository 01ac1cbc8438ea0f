#!/usr/bin/env bash
# Makes .venv/ (git-ignored), the project's Python environment for the tests: exactly the pinned
# packages of test/requirements.txt (numpy, safetensors, tokenizers, transformers, torch,
# tensorboard, matplotlib, pyarrow), so the comparisons against transformers, tokenizers and
# tensorboard run in every `make test` and no package installed by hand can stand in for a
# missing step. PyPI's torch wheel brings CUDA's libraries (5.7 GB installed, about 3.5 minutes
# on a new machine here), so the environment is built once per requirements file and Python
# version in a cache outside the clone (UST_VENV_CACHE, default ~/.cache/ustrain) and .venv is a
# link to it: a second clone on the same machine links it at once. Quiet when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${UST_PYTHON:-python3}
req=test/requirements.txt
key=$({ "$PY" -c 'import sys; print(sys.version)'; cat $req; } | sha256sum | cut -c1-16)
cache=${UST_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ustrain}
dir=$cache/venv-$key
[ -L .venv ] && [ "$(readlink .venv)" = "$dir" ] && [ -f "$dir/.complete" ] && exit 0
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9 # two clones building the same environment: the second waits and links the first's
if [ ! -f "$dir/.complete" ]; then
    echo "venv: building $dir from $req (PyPI; several GB on a new machine)"
    start=$SECONDS
    rm -rf "$dir"
    "$PY" -m venv "$dir" || {
        echo "venv: $PY -m venv failed (Debian's python3 needs python3-venv; UST_PYTHON picks another)" >&2
        exit 1
    }
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$dir/bin/python3" -m pip install -q --no-cache-dir -r $req
    "$dir/bin/python3" -c 'import numpy, safetensors, tokenizers, transformers, torch, tensorboard, matplotlib, pyarrow'
    echo "$((SECONDS - start)) s" >"$dir/.complete"
    echo "venv: built in $((SECONDS - start)) s ($(du -sh "$dir" | cut -f1))"
fi
[ -d .venv ] && [ ! -L .venv ] && rm -rf .venv
ln -sfn "$dir" .venv
