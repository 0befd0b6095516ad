"""Fixtures of the exporter / alerting tests (issue 9)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # `import grafana_store`, `import prom_helpers`
