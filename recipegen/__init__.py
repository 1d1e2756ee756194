"""recipegen: declarative serving recipes for MoE models on memory-tiered GPU boxes."""

__version__ = "0.1.0"
