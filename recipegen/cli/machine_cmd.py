"""`recipegen machine detect`: this box as a machine entry (thin layer over
`recipegen.catalog.detect`); `recipegen machine list`: the catalog machines."""

from __future__ import annotations

import json
from pathlib import Path

import click

from recipegen.cli.types import FileNameText
from recipegen.common.errors import InputError
from recipegen.common.files import output_target


@click.group()
def machine() -> None:
    """Machines: list the catalog's, or read this box's GPUs and host memory into a machine entry."""


@machine.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Machine file to write (default: print it).")
@click.option("--name", type=FileNameText("machine"), help="Entry name (default: the host name).")
@click.option("--record", "record_to", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the raw NVML reading (every call's values) as JSON, e.g. for a test fixture.")
@click.option("--force", is_flag=True, help="Overwrite an existing machine file (and --record file).")
@click.option("--json", "as_json", is_flag=True, help="Print the entry and the readings as JSON.")
def detect(output: Path | None, name: str | None, record_to: Path | None, force: bool, as_json: bool) -> None:
    """GPUs from NVML (name, memory as the driver reports it and the part CUDA does not see, compute
    capability, PCIe generation × width -> host-link bandwidth, HBM bandwidth), host memory from
    /proc/meminfo: a machine entry marked detected, ready for `recipegen new MODEL --machine FILE`
    or a recipe's `machines:`. Needs nvidia-ml-py (pip install 'recipegen[nvml]')."""
    from dataclasses import asdict

    from expert_residency.formats import atomic_write_text

    from recipegen.catalog.detect import PynvmlTable, record, to_yaml
    from recipegen.catalog.detect import detect as run_detect

    # Both outputs are checked before NVML is read: a refused run writes nothing.
    for path, option in ((output, "--output"), (record_to, "--record")):
        if path is None:
            continue
        output_target(path, option)
        if path.exists() and not force:
            raise InputError("exists; pass --force to overwrite", file=str(path), field=option)
    if output is not None and record_to is not None and output.resolve() == record_to.resolve():
        raise InputError("is given as both --output and --record", file=str(output), field="--record")
    table = PynvmlTable()
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file="/proc/meminfo") from None
    reading = record(table) if record_to is not None else None
    found = run_detect(table, meminfo, name=name)
    text = to_yaml(found.entry)
    if record_to is not None:
        atomic_write_text(record_to, json.dumps(reading, indent=2) + "\n")
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(output, text)
    if as_json:
        click.echo(json.dumps({"entry": found.entry, "gpus": [asdict(g) for g in found.gpus],
                               "driver": found.driver, "mem_total_bytes": found.mem_total, "notes": found.notes},
                              indent=2))
        return
    if output is None:
        click.echo(text, nl=False)
    else:
        click.echo(f"wrote {output}: {found.summary()}")
    for note in found.notes:
        click.echo(f"note: {note}", err=True)


@machine.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the ids and their lines as JSON.")
def list_(as_json: bool) -> None:
    """The catalog machines, one a line: the id `recipegen new --machine` and a recipe's
    `machines:` take, its GPUs × GPU memory, host memory and pinned-read bandwidth. A machine file may start
    from one (`catalog: <id>` plus the figures that differ)."""
    from recipegen.cli.output import echo_catalog_list

    echo_catalog_list("machines", as_json)
