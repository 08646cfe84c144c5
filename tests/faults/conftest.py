"""The fault-injection suite (scripts/faults.sh runs it and writes benchmarks/results/faults.md).

Every trial may `record` what it did; with HINTRL_FAULTS_RECORD=FILE set, each record is appended
to FILE as one JSON line, which scripts/faults_report.py turns into the report. Without it records
go nowhere and the tests run as any others (the slow tier of scripts/test.sh).
"""
import json
import os
import re
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A record is committed (benchmarks/results/faults-trials.jsonl): no path of the machine it ran on.
_TEMPORARY = re.compile(re.escape(tempfile.gettempdir()) + r"/[^'\"\s:]*")


def portable(text: str) -> str:
    """`text` with paths in the checkout relative to it and temporary paths as <tmp> (the checkout
    first: it may itself lie under the temporary folder)."""
    return _TEMPORARY.sub("<tmp>", text.replace(f"{ROOT}/", ""))


@pytest.fixture
def record(request):
    """record(suite, outcome, **details): one trial. suite names the fault family (kill, disk,
    output_folder, corrupt_checkpoint, pickle, teacher_endpoint, config); outcome is what the run
    did about it ("survived", "detected", "rejected", "counted", or "failed" when it did not)."""
    path = os.environ.get("HINTRL_FAULTS_RECORD")

    def write(suite: str, outcome: str, **details):
        if path:
            with open(path, "a") as f:
                f.write(portable(json.dumps({"suite": suite, "outcome": outcome, "test": request.node.name,
                                             **details})) + "\n")
    return write
