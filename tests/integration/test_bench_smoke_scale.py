"""Figure 16 at its tiny size: four brokers and 64 agents, vox status, vox watch, vox
exporter, a partition and three restarts (bench/scale.py).

A module of its own, beside tests/integration/test_bench_smoke.py, with the same checks
(tests/kits/benchsmoke.py): at about 100 s it is the suite's longest test, and the suite's
workers take whole modules (pytest -n, --dist loadfile).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.benchsmoke import run_figure


@pytest.mark.timeout(600)
def test_the_scale_figure_runs_at_tiny_size(tmp_path: Path) -> None:
    run_figure("scale", tmp_path)
