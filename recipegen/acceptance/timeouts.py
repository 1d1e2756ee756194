"""How long the acceptance instruments wait for an endpoint: no imports, so the CLI's help can
state it without loading the HTTP client."""

# The identity probe (/v1/models, /version: a run's first requests) gets its own short timeout.
# vLLM answers both from its API server without going through the engine, promptly even under load.
# It binds its port before it loads the model (vllm/entrypoints/launchers/launcher.py, setup_server),
# so a booting vLLM accepts connections and answers nothing for minutes, as a hung server does:
# either way, say so after 30 s instead of after the per-request timeout (--timeout), which is
# sized for long generations on a loaded lane.
IDENTITY_TIMEOUT_S = 30.0
# Each request's answer, by default (`--timeout` of parity and knee).
REQUEST_TIMEOUT_S = 600.0
