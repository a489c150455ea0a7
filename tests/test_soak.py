"""The soak under faults, short (experiments/soak.py runs it for 20 minutes): two slots, four
clients for 45 s of mixed traffic (plain and streamed completions and chats, clients that
leave mid-stream or give up while queued, slow readers, bad requests, oversized bodies, wrong
keys). Every finished greedy answer equals its reference, every refusal is the expected 4xx,
no slot stays busy, nothing stays queued, memory does not grow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[1] / "experiments" / "soak.py"
KINDS = {"complete", "stream", "chat", "chat_stream", "leave_mid_stream", "cancel_waiting",
         "slow_reader", "bad_request", "oversized", "wrong_key"}


def test_a_short_soak_under_faults(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, str(SOAK), "--seconds", "45", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert r.returncode == 0, (report["checks"], report["failures"], r.stderr[-2000:])
    assert all(report["checks"].values())
    assert {k.split(":")[0] for k in report["by_kind"]} == KINDS  # every fault happened
    assert report["requests"] >= 100 and not report["failures"]
    assert report["slots_at_end"] and not any(s["is_processing"]
                                              for s in report["slots_at_end"])
