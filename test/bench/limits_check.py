#!/usr/bin/python3
"""Checks that every row of a benchmark's JSON is held against its limit, and prints them all.

    test/bench/limits_check.py [--missing-ok] FILE.json...

Each entry of a file's row list (`results` or `rows`) must carry a `limit`: one object, or a
list of objects (one per figure of a row that has several, each naming its `figure`):

    {"name": what bounds the figure, in words; "unit": the figure's unit;
     "value": the limit, in that unit; "share": the fraction of the limit the row reached
     (row / limit for a rate, limit / row for a time), from 0 to 10, or null with "why";
     "source": "measured in this run" or where else the limit comes from}

`value` may be null only beside a null share (the limit could not be measured). A file that is
`{"status": "skipped", ...}` (no device for it) passes with a note. docs/benchmarks.md, "Every row
against its limit", says what each benchmark's limits are.

Prints one table, a line per figure of every row of every file (bench, row, figure, the limit's
value, the share reached, what the limit is); exits 1 naming the file and the row of each
malformed limit, 2 on bad arguments. `--missing-ok` notes a file that does not exist and goes on
(`make bench` names the files of benchmarks that may not be built here). Standard library only.
"""

import argparse
import json
import math
import os
import sys

REQUIRED = ("name", "unit", "value", "share", "source")
OPTIONAL = ("why", "figure")
ROW_LISTS = ("results", "rows")
SHARE_MAX = 10.0


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_text(v):
    return isinstance(v, str) and v.strip() != ""


def limit_problems(limit, in_list):
    """What is wrong with one limit object: a list of phrases, empty when it is well formed."""
    if not isinstance(limit, dict):
        return ["a limit that is not an object"]
    problems = []
    missing = [k for k in REQUIRED if k not in limit]
    if missing:
        problems.append("missing " + ", ".join(missing))
    unknown = sorted(k for k in limit if k not in REQUIRED + OPTIONAL)
    if unknown:
        problems.append("unexpected key(s) " + ", ".join(unknown))
    for key in ("name", "unit", "source"):
        if key in limit and not is_text(limit[key]):
            problems.append(f"{key} is not a non-empty string")
    # A row with several figures must say which one each limit is for.
    if in_list and not is_text(limit.get("figure")):
        problems.append("a limit in a list names no figure")
    if "figure" in limit and not is_text(limit["figure"]):
        problems.append("figure is not a non-empty string")
    share = limit.get("share")
    if "share" in limit and share is not None:
        if not is_number(share):
            problems.append(f"share {share!r} is not a number")
        elif not 0 <= share <= SHARE_MAX:
            problems.append(f"share {share:g} is outside [0, {SHARE_MAX:g}]")
    if "share" in limit and share is None and not is_text(limit.get("why")):
        problems.append("share is null without a why")
    value = limit.get("value")
    # An unmeasured limit has no value; a share then cannot have been computed from it.
    if "value" in limit and not is_number(value) and not (value is None and share is None):
        problems.append(f"value {value!r} is not a number")
    return problems


def row_name(row, index):
    """The row's own name (its name, measurement, row or size key), else its index."""
    if isinstance(row, dict):
        for key in ("name", "measurement", "row", "size"):
            if is_text(row.get(key)):
                return row[key]
    return f"#{index}"


def row_limits(row):
    """(limits, problems) of one row: its limit objects, and what is wrong with the row's limit."""
    if not isinstance(row, dict):
        return [], ["the row is not an object"]
    if "limit" not in row:
        return [], ["no limit"]
    limit = row["limit"]
    if isinstance(limit, list):
        if not limit:
            return [], ["an empty list of limits"]
        problems = []
        for k, item in enumerate(limit):
            problems += [f"limit {k}: {p}" for p in limit_problems(item, True)]
        return limit, problems
    if isinstance(limit, dict):
        return [limit], limit_problems(limit, False)
    return [], ["limit is neither an object nor a list"]


def bench_name(doc, path):
    if isinstance(doc, dict) and is_text(doc.get("tool")):
        return doc["tool"]
    return os.path.splitext(os.path.basename(path))[0]


def check_file(path, missing_ok):
    """(table lines, notes, errors) of one file."""
    if not os.path.exists(path):
        return [], [f"{path}: not there"], [] if missing_ok else [f"{path}: no such file"]
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return [], [], [f"{path}: not JSON: {e}"]
    if isinstance(doc, dict) and doc.get("status") == "skipped":
        return [], [f"{path}: skipped ({doc.get('reason', 'no reason given')}): no rows"], []
    rows = None
    if isinstance(doc, dict):
        rows = next((doc[k] for k in ROW_LISTS if isinstance(doc.get(k), list)), None)
    if rows is None:
        return [], [], [f"{path}: no row list ({' or '.join(ROW_LISTS)})"]
    if not rows:
        return [], [], [f"{path}: an empty row list"]
    bench = bench_name(doc, path)
    lines, errors = [], []
    for index, row in enumerate(rows):
        limits, problems = row_limits(row)
        name = row_name(row, index)
        errors += [f"{path}: row {index} ({name}): {p}" for p in problems]
        if problems:
            continue
        for lim in limits:
            lines.append((bench, name, lim.get("figure", "-"), value_cell(lim),
                          share_cell(lim), limit_cell(lim)))
    return lines, [], errors


def value_cell(limit):
    v = limit["value"]
    return "-" if v is None else f"{v:.4g} {limit['unit']}"


def share_cell(limit):
    s = limit["share"]
    return "null" if s is None else f"{s:.3g}"


def limit_cell(limit):
    """What bounds the figure; why there is no share, where there is none."""
    if limit["share"] is None:
        return f"{limit['name']} (no share: {limit['why']})"
    return limit["name"]


def print_table(lines):
    """Columns padded to their widest cell; the limit's name, the longest, last."""
    head = ("bench", "row", "figure", "limit", "share", "what bounds it")
    widths = [max([len(head[c])] + [len(str(line[c])) for line in lines]) for c in range(5)]
    for line in [head] + lines:
        cells = [str(cell).ljust(w) for cell, w in zip(line, widths)]
        print("  ".join(cells + [str(line[5])]).rstrip())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", metavar="FILE.json")
    ap.add_argument("--missing-ok", action="store_true",
                    help="note a file that does not exist instead of failing")
    args = ap.parse_args(argv)
    lines, notes, errors = [], [], []
    for path in args.files:
        file_lines, file_notes, file_errors = check_file(path, args.missing_ok)
        lines += file_lines
        notes += file_notes
        errors += file_errors
    if lines:
        print_table(lines)
    for note in notes:
        print(f"note: {note}")
    for error in errors:
        print(f"limits_check: {error}", file=sys.stderr)
    sys.stdout.flush()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
