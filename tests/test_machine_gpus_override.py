"""A recipe's `{catalog: NAME, gpus: {...}}` override: the same GPU kind keeps the catalog's other
GPU fields (the compute capability above all, which picks the MoE backend and the runtime's bank
kernel); another kind replaces the block."""

from __future__ import annotations

from types import SimpleNamespace

from recipegen.catalog import catalog_entry
from recipegen.schema.recipe import _resolve as _resolve_in

# what the recipe loader passes in the validation context (recipegen.load.recipe)
INFO = SimpleNamespace(context={"catalog": catalog_entry})


def _resolve(kind, value):
    return _resolve_in(kind, value, INFO)


def test_same_kind_override_keeps_the_compute_capability() -> None:
    machine = _resolve("machines", {"catalog": "gb300-station",
                                    "gpus": {"count": 2, "hbm": "250.7 GiB"}})
    gpus = machine["gpus"]
    assert gpus["count"] == 2 and gpus["hbm"] == "250.7 GiB"
    assert gpus["kind"] == "GB300"
    cc = gpus["compute_capability"]
    assert (cc["value"] if isinstance(cc, dict) else cc) == "10.3"


def test_another_kind_replaces_the_block() -> None:
    given = {"kind": "H100", "count": 1, "hbm": "79.6 GiB", "hbm_bandwidth": "3.35 TB/s"}
    machine = _resolve("machines", {"catalog": "gb300-station", "gpus": dict(given)})
    assert machine["gpus"] == given
