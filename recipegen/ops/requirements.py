"""What a recipe asks of a host (doctor RECIPE): see `ledger_view.host_requirement`."""

from recipegen.ops.ledger_view import host_requirement

__all__ = ["host_requirement"]
