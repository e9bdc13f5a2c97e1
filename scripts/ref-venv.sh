#!/usr/bin/env bash
# Creates, or reuses when it is already complete, the Python venv that runs the outside oracles
# (scripts/golden_qwen3.py --impl hf, scripts/golden_lora.py --peft on, scripts/golden_q4.py
# --impl hf): CPU PyTorch, Hugging Face transformers, PEFT and safetensors, at pinned versions so
# the fixtures they make are reproducible. `.ci/run` calls it; run it by hand to set up a
# machine (`bash scripts/ref-venv.sh`), then `npm test` finds the venv by itself.
#
# SPYRL_REF_VENV overrides the folder (default .venv-ref, git-ignored). Other tools share the
# venv (scripts/rouge_fixture.py puts nltk in it), so this only ever adds to it and never
# deletes it; a lock inside it serialises concurrent set-ups.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPYRL_REF_VENV:-.venv-ref}
# Keep in step with README "Golden fixtures" and the *_version fields the fixtures record.
REQS=("torch==2.13.0+cpu" "transformers==5.17.0" "peft==0.21.0" "safetensors==0.8.0" "numpy==2.4.6")
PY_BASE=${SPYRL_REF_PYTHON_BASE:-python3}
[ -x /usr/bin/python3 ] && PY_BASE=${SPYRL_REF_PYTHON_BASE:-/usr/bin/python3}

complete() {
  "$VENV/bin/python" - <<'PY' 2>/dev/null
import torch, transformers, peft, safetensors, numpy
from transformers import Qwen3ForCausalLM
from peft import PeftModel
assert torch.__version__ == "2.13.0+cpu", torch.__version__
assert transformers.__version__ == "5.17.0", transformers.__version__
assert peft.__version__ == "0.21.0", peft.__version__
PY
}

mkdir -p "$VENV"
exec 9>"$VENV/.spyrl-setup.lock"
if ! flock -n 9; then
  echo "ref-venv: another set-up of $VENV is running; waiting for it"
  flock 9
fi
if [ -x "$VENV/bin/python" ] && complete; then
  echo "ref-venv: $VENV is complete (torch 2.13.0+cpu, transformers 5.17.0, peft 0.21.0); reusing it"
  exit 0
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY_BASE" -m venv "$VENV"
# On machines with the local wheel mirror (/opt/pypi), install from it only: pip's default
# index is unreachable there and each package would wait out its retries first.
# Its pip.conf's other extra index is not a folder for most packages; pip would warn about each.
args=()
if [ -d /opt/pypi/simple ]; then
  export PIP_CONFIG_FILE=/dev/null
  args+=(--index-url file:///opt/pypi/simple)
  [ -d /opt/wheels ] && args+=(--find-links /opt/wheels)
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check "${args[@]}" "${REQS[@]}"
if ! complete; then
  echo "ref-venv: $VENV was installed but does not import torch/transformers/peft at the pinned versions" >&2
  exit 1
fi
echo "ref-venv: $VENV ready in $(($(date +%s) - start)) s"
