"""Each notebook's header says how long quick mode takes; it must agree with the time measured
for the start page (notebooks/catalog.json, ``measured.quick_s``), so a reader planning a
workshop is not told one thing on the start page and another in the notebook."""

from __future__ import annotations

import re

import nbformat
import pytest

from helpers import scripts
from labtools import catalog

TOLERANCE = 1.6  # "about": the header may round, but not by more than this factor
_QUICK = re.compile(
    r"about (?P<low>[\d.]+|a|one)(?:[–-](?P<high>[\d.]+))? ?(?P<unit>s|min|minute)\b[^.;]*?"
    r"in quick mode"
)


def header_quick_seconds(stem: str) -> tuple[float, float]:
    """The quick-mode time the first cell states, as a (low, high) range in seconds."""
    first = nbformat.read(scripts.NOTEBOOKS / f"{stem}.ipynb", as_version=4).cells[0].source
    line = next((ln for ln in first.splitlines() if ln.startswith("**Time:**")), "")
    match = _QUICK.search(line)
    assert match, f"{stem}: no '**Time:** about N s|min in quick mode' line in the first cell"
    scale = 1 if match["unit"] == "s" else 60
    low = 1.0 if match["low"] in ("a", "one") else float(match["low"])
    high = float(match["high"]) if match["high"] else low
    return low * scale, high * scale


@pytest.mark.parametrize("entry", catalog.catalog(), ids=lambda e: e["stem"])
def test_header_time_agrees_with_the_measured_time(entry):
    measured = entry.get("measured", {}).get("quick_s")
    if measured is None:
        pytest.skip(f"{entry['stem']}: no measured quick-mode time in catalog.json yet")
    low, high = header_quick_seconds(entry["stem"])
    assert low / TOLERANCE <= measured <= high * TOLERANCE, (
        f"{entry['stem']}: the header says {low:.0f}-{high:.0f} s in quick mode, catalog.json "
        f"measured {measured:.0f} s: update the header (or re-measure with make run QUICK=1)"
    )
