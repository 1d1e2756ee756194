"""Price of a prefetch bank: spare HBM expert slots per layer, paid in KV-cache tokens (pure).

    bank bytes      = slots per layer × MoE layers × bytes per expert
    KV tokens lost  = bank bytes × KV tokens per byte of pool
    share of pool   = KV tokens lost ÷ KV pool tokens

The seeds ("Should a GB300 Prefetch", section 4): 3 slots per layer = 120 experts = 2.1 GiB
≈ 1.09M KV tokens = 43% of a 4.9 GiB (≈ 2.54M-token) pool. The KV tokens per byte come
from the ledger's KV pool of the lane, never from a second formula here.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipegen.costmodel.figures import Figure, Operand

GiB = 2**30


@dataclass(frozen=True)
class PrefetchPrice:
    experts: int
    bank_bytes: Figure
    kv_tokens_lost: Figure
    share_of_pool: Figure

    @property
    def bank_gib(self) -> float:
        return self.bank_bytes.value / GiB


def prefetch_bank_price(*, slots_per_layer: int, moe_layers: int, bytes_per_expert: int,
                        kv_pool_bytes: float, kv_pool_tokens: float, kv_source: str = "") -> PrefetchPrice:
    """What a bank of `slots_per_layer` spare expert slots in every MoE layer costs in KV tokens."""
    if slots_per_layer < 0:
        raise ValueError(f"slots per layer must be >= 0, got {slots_per_layer}")
    if kv_pool_bytes <= 0 or kv_pool_tokens <= 0:
        raise ValueError("the KV pool must be positive to price a prefetch bank against it")
    experts = slots_per_layer * moe_layers
    bank = experts * bytes_per_expert
    tokens_per_byte = kv_pool_tokens / kv_pool_bytes
    bank_fig = Figure("prefetch bank", bank, "B", "slots per layer × MoE layers × bytes per expert", (
        Operand("slots per layer", slots_per_layer), Operand("MoE layers", moe_layers),
        Operand("bytes per expert", bytes_per_expert, "B")))
    lost = bank * tokens_per_byte
    lost_fig = Figure("KV tokens lost", lost, "tokens", "bank bytes × (KV pool tokens ÷ KV pool bytes)", (
        Operand("bank bytes", bank, "B"),
        Operand("KV pool tokens", kv_pool_tokens, "tokens", kv_source),
        Operand("KV pool", kv_pool_bytes / GiB, "GiB", kv_source)))
    share_fig = Figure("share of KV pool", lost / kv_pool_tokens, "", "KV tokens lost ÷ KV pool tokens", (
        Operand("KV tokens lost", lost, "tokens"), Operand("KV pool tokens", kv_pool_tokens, "tokens", kv_source)))
    return PrefetchPrice(experts=experts, bank_bytes=bank_fig, kv_tokens_lost=lost_fig, share_of_pool=share_fig)
