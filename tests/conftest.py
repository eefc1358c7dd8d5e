import os
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
sys.path.insert(0, str(REPO_ROOT / "src"))
# One thread: on a shared 2-core machine, 2 torch threads per process oversubscribe and run ~20x slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
