"""`python -m fleetsim` (make demo) in fast mode only, on a short workload: every policy runs, the report is
written, and the invariants it states hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetsim.demo import FAST_POLICIES, main


def test_the_demo_writes_a_report_comparing_every_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-wire", "--hours", "0.25", "--seeds", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for policy in FAST_POLICIES:
        assert policy in out
    summary = json.loads((tmp_path / "report.json").read_text())
    groups = {(g["mode"], g["policy"]): g for g in summary["groups"]}
    assert set(groups) == {("fast", p) for p in FAST_POLICIES}
    assert groups[("fast", "tandem")]["split_gangs"] == 0  # domain-pinned dispatch cannot split a gang
    assert groups[("fast", "tandem")]["jobs"] > 0
    assert (tmp_path / "report.md").read_text().count("fast mode") > 0
    assert any(p.suffix == ".png" for p in tmp_path.iterdir())
