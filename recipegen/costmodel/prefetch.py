"""Price of a prefetch bank: spare HBM expert slots per layer, paid in KV-cache tokens.

The ledger owns the formulas: it reserves `prefetch_slots_per_layer × MoE layers × bytes per
expert` of HBM (`hbm.prefetch_bank`) and shrinks the KV pool by it. The price is the difference
between the lane's ledger without and with the bank:

    KV tokens lost = kv.tokens(no bank) − kv.tokens(bank)
    share of pool  = KV tokens lost ÷ kv.tokens(no bank)

The field reports ("Should a GB300 Prefetch", section 4): 3 slots per layer = 120 experts = 2.1 GiB
≈ 1.09M KV tokens = 43% of a 4.9 GiB (≈ 2.54M-token) pool.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from recipegen.common.units import GiB
from recipegen.costmodel.figures import Figure, Operand


@dataclass(frozen=True)
class PrefetchPrice:
    slots_per_layer: int
    experts: int
    bank_bytes: Figure
    kv_pool_bytes: float          # without the bank
    kv_tokens_before: float
    kv_tokens_after: float
    kv_tokens_lost: Figure
    share_of_pool: Figure

    @property
    def bank_gib(self) -> float:
        return self.bank_bytes.value / GiB


def price_from_ledgers(without: Any, with_bank: Any, *, slots_per_layer: int, moe_layers: int) -> PrefetchPrice:
    """The price from two ledgers of one lane (`LaneLedger`s): without and with the bank."""
    bank = with_bank.figures.get("hbm.prefetch_bank")
    bank_bytes = float(bank.value) if bank is not None else 0.0
    before = float(without.fig("kv.tokens").value)
    after = float(with_bank.fig("kv.tokens").value)
    bank_fig = Figure("prefetch bank (per GPU)", bank_bytes, "B",
                      bank.formula if bank is not None else "no bank",
                      tuple(Operand(k, float(v)) for k, v in (bank.operands if bank is not None else {}).items()))
    lost = Figure("KV tokens lost", before - after, "tokens", "ledger kv.tokens without − with the bank", (
        Operand("KV tokens without the bank", before, "tokens", "ledger"),
        Operand("KV tokens with the bank", after, "tokens", "ledger")))
    share = Figure("share of the KV pool", (before - after) / before if before else 0.0, "",
                   "KV tokens lost ÷ KV tokens without the bank", (
                       Operand("KV tokens lost", before - after, "tokens"),
                       Operand("KV tokens without the bank", before, "tokens")))
    return PrefetchPrice(slots_per_layer, slots_per_layer * moe_layers, bank_fig,
                         float(without.fig("hbm.kv_pool").value), before, after, lost, share)


def lane_prefetch_price(loaded: Any, lane_name: str, slots_per_layer: int) -> PrefetchPrice:
    """What a bank of `slots_per_layer` spare slots per MoE layer costs this lane, per its ledger."""
    from recipegen.ledger import compute_ledger

    if slots_per_layer < 0:
        raise ValueError(f"slots per layer must be >= 0, got {slots_per_layer}")
    recipe = loaded.recipe

    def with_slots(slots: int) -> Any:
        lanes = [lane.model_copy(update={"offload": lane.offload.model_copy(
                     update={"prefetch_slots_per_layer": slots})}) if lane.name == lane_name else lane
                 for lane in recipe.lanes]
        variant = dataclasses.replace(loaded, recipe=recipe.model_copy(update={"lanes": lanes}))
        return compute_ledger(variant).lane(lane_name)

    return price_from_ledgers(with_slots(0), with_slots(slots_per_layer), slots_per_layer=slots_per_layer,
                              moe_layers=recipe.model.num_moe_layers)
