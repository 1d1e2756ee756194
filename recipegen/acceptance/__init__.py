"""Acceptance instruments against running OpenAI-compatible endpoints.

`parity`: greedy token-exact comparison of two endpoints over a fixture, separating a
placement effect (A ≠ B while A agrees with itself) from serving nondeterminism (A disagrees
with itself). `knee`: steady-state tok/s and latency per concurrency, optionally candidate–
control–candidate. Both record the endpoint's identity (`identity`): models, vLLM version
and, for a recipegen lane, the start-up report with the row map's hashes.
"""
