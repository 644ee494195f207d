"""Render the chaos suite's figures into ``docs/reliability.md`` (``make chaos`` runs it).

Reads the JSONL the chaos suite appends to (``PDSERVE_CHAOS_RESULTS``): one row per fault
scenario (``tests/chaos/harness.FaultResult``) and one ``{"fuzz": {...}}`` tally per fuzzing run.
Rewrites the part of the document between ``<!-- figures:begin -->`` and ``<!-- figures:end -->``:
the headline figures (faults survived / tried, bad inputs handled / tried, requests lost), the
fault matrix and the fuzzing tally. Prints the headline as one JSON line last.

Usage: ``python benchmarks/reliability_report.py RESULTS.jsonl docs/reliability.md``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"


def survived(row: dict[str, Any]) -> bool:
    """A fault is survived when all four invariants held."""
    return (
        row["kv_idle"]
        and row["lost"] == 0
        and row["identical"] == row["completed"]
        and row["moved"] == row["expected"]
    )


def render(rows: list[dict[str, Any]], fuzz: Counter[str]) -> tuple[str, dict[str, Any]]:
    """The Markdown block and the headline figures."""
    faults = [r for r in rows if "fault" in r]
    cases = sum(fuzz.values())
    server_errors = sum(n for key, n in fuzz.items() if key.endswith(" 5xx"))
    headline = {
        "faults_survived": sum(survived(r) for r in faults),
        "faults_tried": len(faults),
        "bad_inputs_handled": cases - server_errors,
        "bad_inputs_tried": cases,
        "requests_lost": sum(r["lost"] for r in faults),
    }
    lines = [
        f"- Faults survived / tried: **{headline['faults_survived']} / "
        f"{headline['faults_tried']}**",
        f"- Fuzzed requests handled without a 5xx / tried: **{headline['bad_inputs_handled']} / "
        f"{cases}**",
        f"- Requests lost: **{headline['requests_lost']}**",
        "",
        "| fault | requests | completed | errors | cancelled | lost | identical to no-fault |"
        " counter | expected | moved | KV idle after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in faults:
        lines.append(
            f"| {r['fault']} | {r['requests']} | {r['completed']} | {r['errors']} | "
            f"{r['cancelled']} | {r['lost']} | {r['identical']}/{r['completed']} | "
            f"`{r['counter']}` | {r['expected']:g} | {r['moved']:g} | "
            f"{'yes' if r['kv_idle'] else 'NO'} |"
        )
    notes = [f"- {r['fault']}: {note}" for r in faults for note in r.get("notes", ())]
    if notes:
        lines += ["", *notes]
    lines += ["", "| fuzzed operation | 2xx | 4xx | 5xx |", "|---|---|---|---|"]
    operations = sorted({key.rsplit(" ", 1)[0] for key in fuzz})
    for op in operations:
        counts = [fuzz.get(f"{op} {c}xx", 0) for c in (2, 4, 5)]
        lines.append(f"| `{op}` | {counts[0]} | {counts[1]} | {counts[2]} |")
    return "\n".join(lines), headline


def main(results_path: str, doc_path: str) -> int:
    rows: list[dict[str, Any]] = []
    fuzz: Counter[str] = Counter()
    path = Path(results_path)
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        if "fuzz" in row:
            fuzz.update(row["fuzz"])
        else:
            rows.append(row)
    block, headline = render(rows, fuzz)
    doc = Path(doc_path)
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc_path} has no {BEGIN} ... {END} section to fill")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
