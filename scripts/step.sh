# Sourced by the setup scripts and scripts/test: `step "what is being done" command args...`
# prints what it is about to do, runs it, and prints how long it took (on stderr, so test output
# stays clean). A failing command fails the step with its exit status.
step() {
  local what=$1 start rc=0
  shift
  echo "==> $what" >&2
  start=$(date +%s)
  "$@" || rc=$?
  echo "    $(( $(date +%s) - start )) s: $what$([ "$rc" = 0 ] || echo " FAILED (exit $rc)")" >&2
  return "$rc"
}
