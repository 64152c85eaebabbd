"""The escape suite: tests/ on the import path (the shared engine helpers live there)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
