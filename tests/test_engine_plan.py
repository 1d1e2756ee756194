"""The real-engine tests' boot plan (tests/vllm_support/shared.py) with stand-in servers: each
configuration booted once for all its jobs, the next boot launched while the current server
serves and never more than two alive, a job marked ``alone`` served with no other boot running,
the count-only profile (``maps``) booted beside the first server only, and a failed boot or job
failing only the tests that read it."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_support.shared import Boot, Registry, run_plan


class Stand:
    """What run_plan needs of a VllmServer; records the order of events."""

    def __init__(self, name: str, env: dict[str, str], events: list[str], alive: set[str]) -> None:
        self.name, self.runtime_env, self.events, self.alive = name, env, events, alive
        self.log_path = Path("/nonexistent") / name
        events.append(f"launch {name}")
        alive.add(name)
        self.peak = len(alive)

    def wait_ready(self) -> Stand:
        if self.runtime_env.get("fail") == "boot":
            raise AssertionError(f"{self.name} exited before it was ready")
        self.events.append(f"ready {self.name}")
        return self

    def stop(self) -> int:
        self.events.append(f"stop {self.name}")
        self.alive.discard(self.name)
        return 0

    def log_text(self) -> str:
        return f"log of {self.name}"


def _plan(tmp_path: Path, boots: list[Boot], jobs: list[tuple[str, str, dict]], *,
          maps_boot: bool = False):
    registry = Registry()
    for boot in boots:
        registry.add_boot(boot)
    events: list[str] = []
    alive: set[str] = set()
    peaks: list[int] = []

    def job(boot: str, name: str, fail: bool):
        def run(server, ctx):
            events.append(f"job {boot}/{name} alive={sorted(alive)}")
            peaks.append(len(alive))
            if fail:
                raise AssertionError(f"{name} failed")
            return (server.name, sorted(ctx.earlier))
        return run

    from vllm_support.shared import Job
    for boot, name, opts in jobs:
        registry.add(Job(boot, name, job(boot, name, opts.pop("fail", False)), "m", **opts))

    def launch(name, env, extra_args, extra_pythonpath, model):
        server = Stand(name, env, events, alive)
        peaks.append(len(alive))
        return server

    def maps():
        events.append(f"maps alive={sorted(alive)}")
        peaks.append(len(alive) + 1)      # the count-only profile's own server
        return {"hot5": tmp_path / "hot5.rowmap"}

    counter = iter(range(100))
    done = run_plan(registry.plan(None), launch=launch, model_dir=tmp_path, maps=maps,
                    folder=lambda name: tmp_path / f"{name}{next(counter)}", scratch=tmp_path)
    return done, events, max(peaks)


def test_one_boot_per_configuration_two_at_a_time(tmp_path: Path) -> None:
    boots = [Boot("u", lambda ctx: {}), Boot("h", lambda ctx: {"map": str(ctx.maps()["hot5"])},
                                             uses_maps=True),
             Boot("s", lambda ctx: {}), Boot("a", lambda ctx: {}, after=("u",))]
    done, events, peak = _plan(tmp_path, boots, [
        ("u", "first-module", {}), ("u", "fresh", {"first": True}), ("h", "x", {"needs": ("u",)}),
        ("s", "y", {}), ("a", "z", {})])
    assert [e for e in events if e.startswith("launch")] == ["launch u", "launch h", "launch s",
                                                             "launch a"]
    # u boots beside the count-only profile; h while u serves; s while h serves; a after s.
    assert events.index("launch u") < events.index("maps alive=['u']") < events.index("ready u")
    assert events.index("launch h") < events.index("job u/fresh alive=['h', 'u']")
    assert events.index("job u/fresh alive=['h', 'u']") < events.index(
        "job u/first-module alive=['h', 'u']")
    assert events.index("launch s") < events.index("ready h")
    assert peak == 2
    assert done["h"].result("x") == ("h", ["u"])
    assert done["a"].result("z") == ("a", ["u"])
    assert done["u"].log == "log of u"


def test_a_job_alone_has_the_machine_to_itself(tmp_path: Path) -> None:
    boots = [Boot("u", lambda ctx: {}), Boot("k", lambda ctx: {}), Boot("s", lambda ctx: {})]
    _, events, _ = _plan(tmp_path, boots, [("u", "a", {}), ("k", "knee", {"alone": True}),
                                           ("s", "b", {})])
    assert "job k/knee alive=['k']" in events
    assert events.index("stop k") < events.index("launch s")


def test_a_failed_boot_or_job_fails_only_its_readers(tmp_path: Path) -> None:
    boots = [Boot("u", lambda ctx: {}), Boot("bad", lambda ctx: {"fail": "boot"}),
             Boot("env", lambda ctx: 1 / 0), Boot("s", lambda ctx: {})]
    done, events, _ = _plan(tmp_path, boots, [
        ("u", "broken", {"fail": True}), ("u", "fine", {}), ("bad", "b", {}), ("env", "e", {}),
        ("s", "later", {})])
    with pytest.raises(AssertionError, match="broken failed"):
        done["u"].result("broken")
    assert done["u"].result("fine") == ("u", [])
    with pytest.raises(AssertionError, match="exited before it was ready"):
        done["bad"].result("b")
    with pytest.raises(ZeroDivisionError):
        done["env"].result("e")
    assert done["s"].result("later") == ("s", [])
    assert "stop bad" in events          # a server that failed to come up is still stopped


def test_the_registry_refuses_what_cannot_run() -> None:
    from vllm_support.shared import Job

    registry = Registry()
    registry.add_boot(Boot("u", lambda ctx: {}))
    with pytest.raises(ValueError, match="unknown boots"):
        registry.add_boot(Boot("a", lambda ctx: {}, after=("nope",)))
    registry.add(Job("u", "one", lambda s, c: 1, "m", first=True))
    with pytest.raises(ValueError, match="counters untouched"):
        registry.add(Job("u", "two", lambda s, c: 2, "m", first=True))
    with pytest.raises(ValueError, match="two jobs named"):
        registry.add(Job("u", "one", lambda s, c: 3, "m"))
    with pytest.raises(ValueError, match="no boot"):
        registry.add(Job("x", "one", lambda s, c: 3, "m"))
    registry.add_boot(Boot("b", lambda ctx: {}, after=("u",)))
    registry.add(Job("b", "needs-u", lambda s, c: 4, "other"))
    # b's module alone selected: u (which b comes after) has no selected job
    with pytest.raises(ValueError, match="which no selected module asks for"):
        registry.plan({"other"})
    assert [boot.name for boot, _ in registry.plan(None)] == ["u", "b"]
