"""`recipegen schema`: the recipe language as JSON Schema, or as the Markdown field reference."""

from __future__ import annotations

import json
from pathlib import Path

import click
from expert_residency.formats import atomic_write_text

from recipegen.common.errors import RecipegenError


@click.command()
@click.option("--markdown", is_flag=True, help="The field reference (docs/recipe-reference.md) instead.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to this file (atomically) instead of stdout.")
@click.option("--check", "check_only", is_flag=True,
              help="Exit 1 if --output differs from what would be written (keeps committed docs fresh).")
def schema(markdown: bool, output: Path | None, check_only: bool) -> None:
    """Export the recipe JSON Schema (or, with --markdown, the field reference)."""
    from recipegen.catalog import catalog_names
    from recipegen.schema.export import recipe_json_schema, recipe_reference_markdown

    text = recipe_reference_markdown(catalog_names) if markdown else \
        json.dumps(recipe_json_schema(catalog_names), indent=2)
    text = text.rstrip("\n") + "\n"
    if output is None:
        if check_only:
            raise RecipegenError("--check needs --output FILE")
        click.echo(text, nl=False)
        return
    if check_only:
        current = output.read_text(encoding="utf-8") if output.is_file() else None
        if current != text:
            click.echo(f"{output} is out of date: run `recipegen schema{' --markdown' if markdown else ''} "
                       f"-o {output}`", err=True)
            raise SystemExit(1)
        click.echo(f"{output} is up to date")
        return
    atomic_write_text(output, text)
    click.echo(f"wrote {output}")
