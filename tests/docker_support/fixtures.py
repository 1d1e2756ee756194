"""pytest fixtures for the engine tests. Import them into a test module:

    from docker_support.fixtures import docker_engine  # noqa: F401

The engine is one per test process (started on first use, stopped by PID at exit), so several
modules share it; a test skips with the reason when the daemon cannot start within ~30 s.
"""

from __future__ import annotations

import atexit

import pytest

from docker_support.engine import EngineUnavailable, PrivateDockerd

_engine: PrivateDockerd | None = None
_failure: str | None = None


def _shared_engine() -> PrivateDockerd:
    global _engine, _failure
    if _failure is not None:
        pytest.skip(f"Docker engine unavailable: {_failure}")
    if _engine is None:
        engine = PrivateDockerd()
        try:
            engine.start()
        except EngineUnavailable as exc:
            _failure = str(exc)
            pytest.skip(f"Docker engine unavailable: {_failure}")
        atexit.register(engine.stop)
        _engine = engine
    return _engine


@pytest.fixture(scope="session")
def docker_engine() -> PrivateDockerd:
    """A private dockerd (own data-root, exec-root, socket, pidfile; no bridge, no iptables)."""
    return _shared_engine()
