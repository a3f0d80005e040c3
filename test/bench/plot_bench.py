#!/usr/bin/python3
"""SVG curves of ferry's benchmarks, drawn from the JSON files they write.

From ferry-bench's JSON (--bench, `make bench` writes build/bench.json):
  round-trip-vs-size.svg   round trip p50 (and ferry zero-copy's p99) against message size, for
                           ferry zero-copy, ferry copy-on-send and torch.multiprocessing, with the
                           1-byte pipe round trip as the limit
  throughput-vs-size.svg   one-way GB/s against message size for the same three, with memcpy and
                           memcpy into rotating destinations as the limits
From the fan-in benchmark's JSON (--fanin):
  fanin-vs-producers.svg   messages/s and p99 latency against the number of producers, one line
                           per message size, ferry solid and torch.multiprocessing dashed
From ferry-pool-bench's JSON (--pool):
  pool-vs-workers.svg      mlp tasks/s against workers for ferry's pool and
                           torch.multiprocessing.Pool, with perfect scaling of one ferry worker
                           up to the core count as the limit

Every input is optional: a plot whose input is not given or does not exist is skipped with a
line on stderr. The path of each SVG written is printed on stdout. Exit status: 0 when at least
one plot was written, 1 when an input exists but cannot be read (the message names the file and
the missing key) or nothing could be plotted, 2 on bad arguments.

The same input gives byte-identical SVGs (fixed hash salt, text kept as text, no date), so the
images can be committed and a rerun on unchanged JSON leaves them untouched.

Needs matplotlib: Debian's python3-matplotlib is importable by /usr/bin/python3.
Usage: plot_bench.py --bench build/bench.json --pool build/pool-bench.json \\
           --fanin build/fanin-bench.json --out docs/images
"""

import argparse
import json
import math
import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402 - the backend must be chosen first
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

# What makes the output reproducible: a fixed salt for the ids matplotlib hashes into the SVG,
# and text as <text> elements rather than glyph paths whose ids would depend on the font cache.
RC = {
    "svg.hashsalt": "ferry-bench-plots",
    "svg.fonttype": "none",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8,
}

FERRY_ZERO_COPY = "C0"
FERRY_COPY = "C1"
TORCH = "C2"
LIMIT = "0.25"
LIMIT_2 = "0.55"

ROUND_TRIP = "round-trip-vs-size.svg"
THROUGHPUT = "throughput-vs-size.svg"
FANIN = "fanin-vs-producers.svg"
POOL = "pool-vs-workers.svg"


class InputError(Exception):
    """A JSON document that lacks what a plot needs; the message names the key."""


# ---------------------------------------------------------------------------------------------
# Extraction: JSON dict -> points. Pure, so the tests can feed them small hand-written dicts.


def _key_path(path):
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def _get(obj, *path, where=()):
    """obj[path[0]][path[1]]...; a missing key raises InputError naming its full path."""
    for i, k in enumerate(path):
        full = tuple(where) + tuple(path[: i + 1])
        if isinstance(k, int):
            if not isinstance(obj, list) or k >= len(obj):
                raise InputError(f"missing key {_key_path(full)}")
        elif not isinstance(obj, dict) or k not in obj:
            raise InputError(f"missing key {_key_path(full)}")
        obj = obj[k]
    return obj


def _number(obj, *path, where=()):
    """A numeric leaf, or None where the writer had no value (nlohmann writes NaN as null)."""
    v = _get(obj, *path, where=where)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"key {_key_path(tuple(where) + path)} is not a number: {v!r}")
    return float(v) if math.isfinite(v) else None


def _results(report):
    results = _get(report, "results")
    if not isinstance(results, list) or not results:
        raise InputError("key results is empty or not a list")
    return results


def _by_size(report, fields):
    """{name: [(size_bytes, value)]} over results, sorted by size; `fields` maps each name to
    (mode, key path within the mode). A mode absent at a size (a peer that was skipped, or ran
    at fewer sizes) leaves no point there; a mode present without the key is an error, since
    that is a writer out of step with this script rather than a skipped measurement."""
    series = {name: [] for name in fields}
    for i, entry in enumerate(_results(report)):
        size = _number(entry, "size_bytes", where=("results", i))
        if size is None:
            raise InputError(f"key results[{i}].size_bytes is null")
        for name, (mode, path) in fields.items():
            if not isinstance(entry, dict) or mode not in entry:
                continue
            v = _number(entry, mode, *path, where=("results", i))
            if v is not None:
                series[name].append((size, v))
    for points in series.values():
        points.sort()
    if not any(series.values()):
        raise InputError("no measurement in any entry of results")
    return series


def round_trip_points(report):
    """ferry-bench JSON -> {series: [(size_bytes, round trip us)]}, each sorted by size."""
    return _by_size(report, {
        "ferry_zero_copy": ("ferry_zero_copy", ("round_trip_us", "p50")),
        "ferry_zero_copy_p99": ("ferry_zero_copy", ("round_trip_us", "p99")),
        "ferry_copy": ("ferry_copy", ("round_trip_us", "p50")),
        "torch_shared": ("torch_shared", ("round_trip_us", "p50")),
        "pipe_1byte": ("pipe_1byte", ("round_trip_us", "p50")),
    })


def throughput_points(report):
    """ferry-bench JSON -> {series: [(size_bytes, GB/s)]}, each sorted by size."""
    return _by_size(report, {
        "ferry_zero_copy": ("ferry_zero_copy", ("throughput", "gb_per_s")),
        "ferry_copy": ("ferry_copy", ("throughput", "gb_per_s")),
        "torch_shared": ("torch_shared", ("throughput", "gb_per_s")),
        "memcpy": ("memcpy", ("gb_per_s",)),
        "memcpy_rotating": ("memcpy_rotating", ("gb_per_s",)),
    })


def rotating_destinations(report):
    """How many destinations memcpy_rotating cycled through, for its label (None if unknown)."""
    for entry in report.get("results") or []:
        n = (entry.get("memcpy_rotating") or {}).get("destinations")
        if isinstance(n, int):
            return n
    return None


FANIN_IMPLS = ("ferry", "torch")


def fanin_lines(report):
    """fan-in JSON -> lines, one per (implementation, message size), sorted by size then ferry
    before torch; each {"impl", "size_bytes", "size", "messages_per_s": [(producers, x)],
    "p99_us": [(producers, x)]}, points sorted by producers. Also the sorted producer counts."""
    lines = {}
    producers = set()
    for i, entry in enumerate(_results(report)):
        where = ("results", i)
        p = _number(entry, "producers", where=where)
        size = _number(entry, "size_bytes", where=where)
        if p is None or size is None:
            raise InputError(f"key results[{i}].producers or size_bytes is null")
        label = entry.get("size") or human_size(size)
        for impl in FANIN_IMPLS:
            if impl not in entry:
                continue
            line = lines.setdefault((size, FANIN_IMPLS.index(impl)), {
                "impl": impl, "size_bytes": size, "size": label,
                "messages_per_s": [], "p99_us": []})
            rate = _number(entry, impl, "messages_per_s", where=where)
            p99 = _number(entry, impl, "latency_us", "p99", where=where)
            if rate is not None:
                line["messages_per_s"].append((p, rate))
            if p99 is not None:
                line["p99_us"].append((p, p99))
            producers.add(p)
    for line in lines.values():
        line["messages_per_s"].sort()
        line["p99_us"].sort()
    if not producers:
        raise InputError("no ferry or torch measurement in any entry of results")
    return [lines[k] for k in sorted(lines)], sorted(producers)


def _worker_rates(report, impl, required):
    if not required and not isinstance(report.get(impl), dict):
        return []
    if not required and "mlp_tasks_per_s" not in report[impl]:
        return []  # a skipped baseline: {"skipped": reason}
    rates = _get(report, impl, "mlp_tasks_per_s")
    if not isinstance(rates, dict):
        raise InputError(f"key {impl}.mlp_tasks_per_s is not an object")
    points = []
    for k in rates:
        try:
            w = int(k)
        except ValueError:
            raise InputError(f"key {impl}.mlp_tasks_per_s.{k} is not a worker count") from None
        v = _number(rates, k, where=(impl, "mlp_tasks_per_s"))
        if v is not None:
            points.append((w, v))
    return sorted(points)


def pool_points(report):
    """pool-bench JSON -> {"ferry": [(workers, tasks/s)], "torch": [...], "cores": N,
    "limit": [(workers, tasks/s)]}. The limit is the one-worker ferry rate times
    min(workers, cores), at the worker counts measured and at the core count where that falls
    between them (the knee); empty when no one-worker rate was measured."""
    cores = report.get("cores")
    if cores is None:
        cores = _get(report, "machine", "cores") if "machine" in report else _get(report, "cores")
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise InputError(f"key cores is not a positive integer: {cores!r}")
    ferry = _worker_rates(report, "ferry", required=True)
    if not ferry:
        raise InputError("key ferry.mlp_tasks_per_s has no value")
    torch = _worker_rates(report, "torch", required=False)
    one = dict(ferry).get(1)
    limit = []
    if one is not None:
        xs = {w for w, _ in ferry + torch}
        if min(xs) <= cores <= max(xs):
            xs.add(cores)
        limit = [(w, one * min(w, cores)) for w in sorted(xs)]
    return {"ferry": ferry, "torch": torch, "cores": cores, "limit": limit}


def machine_note(report):
    """The footnote: the machine the numbers come from and when they were taken."""
    m = report.get("machine") if isinstance(report.get("machine"), dict) else {}
    parts = []
    if m.get("cpu_model"):
        parts.append(str(m["cpu_model"]))
    cores = m.get("cores", report.get("cores"))
    if cores is not None:
        parts.append(f"{cores} cores")
    if isinstance(m.get("memory_gib"), (int, float)):
        parts.append(f"{m['memory_gib']:.1f} GiB memory")
    if m.get("virtual_machine"):
        parts.append("virtual machine")
    for k in ("os", "kernel"):
        if m.get(k):
            parts.append(str(m[k]))
    if m.get("libtorch"):
        parts.append(f"LibTorch {m['libtorch']}")
    lines = ["Machine: " + (", ".join(parts) if parts else "not recorded") + "."]
    run = f"Run: {report['date']}" if report.get("date") else "Date of the run not recorded"
    config = report.get("config") if isinstance(report.get("config"), dict) else {}
    if config.get("quick"):
        run += " (--quick: few iterations, noisy)"
    if report.get("tool"):
        run += f", {report['tool']}"
    torch = report.get("torch")
    if isinstance(torch, dict):
        if torch.get("torch_version"):
            run += f"; PyTorch {torch['torch_version']}"
        # ferry-bench writes {"status": "skipped", "reason": ...}, pool-bench {"skipped": ...}.
        if torch.get("status") in ("skipped", "failed") or "skipped" in torch:
            reason = torch.get("reason") or torch.get("skipped")
            run += f"; torch.multiprocessing baseline not run: {reason}"
    lines.append(run + ".")
    return "\n".join(lines)


def human_size(n):
    """4096 -> '4 KiB'; sizes that are not a whole number of a unit keep up to 3 digits."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def spans_decades(values):
    """Whether a log axis suits these values: all positive and the largest at least 10 times the
    smallest (a linear axis squeezes the small ones onto the floor)."""
    values = [v for v in values if v is not None]
    return bool(values) and min(values) > 0 and max(values) >= 10 * min(values)


# ---------------------------------------------------------------------------------------------
# Drawing.


def _xs(points):
    return [x for x, _ in points]


def _ys(points):
    return [y for _, y in points]


def _plot(ax, points, label, **style):
    """One series; a lone point of a line without markers gets one, or it would not show (a run
    of ferry-bench at a single size)."""
    if not points:
        return
    if len(points) == 1 and "marker" not in style:
        style = dict(style, marker="_", ms=14, mew=1.5)
    ax.plot(_xs(points), _ys(points), label=label, **style)


def _new_figure(width=8.0, height=5.0):
    return Figure(figsize=(width, height), dpi=100)


def _footnote(fig, note):
    wrapped = [w for line in note.split("\n") for w in textwrap.wrap(line, 160)]
    fig.text(0.01, 0.01, "\n".join(wrapped), fontsize=6.5, color="0.3", ha="left", va="bottom")


def _size_axis(ax, sizes):
    """Ticks at the sizes measured, labelled in KiB/MiB: powers of two read badly as 10^k."""
    if spans_decades(sizes):
        ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(sizes))))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_size(v)))
    ax.set_xlabel("message size (bytes, shown in KiB/MiB)")


def _count_axis(ax, counts, label):
    if spans_decades(counts):
        ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(counts))))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(label)


def _y_scale(ax, series):
    if spans_decades([y for points in series for y in _ys(points)]):
        ax.set_yscale("log")


def _finish(fig, path, note, rect_bottom=0.06):
    _footnote(fig, note)
    fig.tight_layout(rect=(0, rect_bottom, 1, 1))
    # No date: a rerun on the same JSON must give the same bytes. No creator either, so that
    # a matplotlib upgrade that draws the same thing does not change every committed image.
    fig.savefig(path, format="svg", metadata={"Date": None, "Creator": None})


def draw_round_trip(series, note, path):
    fig = _new_figure()
    ax = fig.add_subplot()
    zc, zc99 = series["ferry_zero_copy"], series["ferry_zero_copy_p99"]
    if zc and zc99 and _xs(zc) == _xs(zc99):
        ax.fill_between(_xs(zc), _ys(zc), _ys(zc99), color=FERRY_ZERO_COPY, alpha=0.12, lw=0)
    styles = (
        ("ferry_zero_copy", "ferry zero-copy, p50", dict(color=FERRY_ZERO_COPY, marker="o")),
        ("ferry_zero_copy_p99", "ferry zero-copy, p99",
         dict(color=FERRY_ZERO_COPY, ls=":", lw=1.0)),
        ("ferry_copy", "ferry copy-on-send, p50", dict(color=FERRY_COPY, marker="s")),
        ("torch_shared", "torch.multiprocessing (shared tensor), p50",
         dict(color=TORCH, marker="^")),
        ("pipe_1byte", "limit: 1-byte pipe round trip, p50", dict(color=LIMIT, ls="--")),
    )
    for key, label, style in styles:
        _plot(ax, series[key], label, **style)
    _size_axis(ax, [x for points in series.values() for x in _xs(points)])
    _y_scale(ax, series.values())
    ax.set_ylabel("round trip (µs)")
    ax.set_title("Round trip against message size (lower is better)")
    ax.legend(loc="best")
    _finish(fig, path, note)


def draw_throughput(series, note, destinations, path):
    fig = _new_figure()
    ax = fig.add_subplot()
    rotating = (f"limit: memcpy into {destinations} rotating destinations" if destinations
                else "limit: memcpy into rotating destinations")
    styles = (
        ("ferry_zero_copy", "ferry zero-copy", dict(color=FERRY_ZERO_COPY, marker="o")),
        ("ferry_copy", "ferry copy-on-send", dict(color=FERRY_COPY, marker="s")),
        ("torch_shared", "torch.multiprocessing (shared tensor)", dict(color=TORCH, marker="^")),
        ("memcpy", "limit: memcpy, one core, warm buffers", dict(color=LIMIT, ls="--")),
        ("memcpy_rotating", rotating, dict(color=LIMIT_2, ls=(0, (6, 3, 1, 3)))),
    )
    for key, label, style in styles:
        _plot(ax, series[key], label, **style)
    _size_axis(ax, [x for points in series.values() for x in _xs(points)])
    _y_scale(ax, series.values())
    ax.set_ylabel("one-way throughput (GB/s, 10⁹ bytes/s)")
    ax.set_title("One-way throughput against message size (higher is better)")
    ax.legend(loc="best")
    _finish(fig, path, note)


FANIN_LABEL = {"ferry": "ferry", "torch": "torch.multiprocessing"}


def draw_fanin(lines, producers, note, path):
    fig = _new_figure(11.0, 5.0)
    rate_ax, p99_ax = fig.subplots(1, 2)
    sizes = sorted({line["size_bytes"] for line in lines})
    for line in lines:
        colour = f"C{sizes.index(line['size_bytes']) % 10}"
        style = (dict(color=colour, marker="o") if line["impl"] == "ferry"
                 else dict(color=colour, marker="s", ls="--", mfc="none"))
        label = f"{FANIN_LABEL[line['impl']]}, {line['size']}"
        for ax, key in ((rate_ax, "messages_per_s"), (p99_ax, "p99_us")):
            _plot(ax, line[key], label, **style)
    for ax, key, ylabel, title in (
            (rate_ax, "messages_per_s", "messages/s into the consumer (all producers)",
             "Messages per second (higher is better)"),
            (p99_ax, "p99_us", "latency, p99 (µs)", "p99 latency (lower is better)")):
        _count_axis(ax, producers, "producers (one consumer)")
        _y_scale(ax, [line[key] for line in lines])
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    # One legend for both panels, below them: inside either it would cover some line.
    handles, labels = rate_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.045),
               ncol=min(4, len(labels)), frameon=False)
    fig.suptitle("Fan-in: producers sending to one consumer (ferry solid, torch dashed)")
    rows = -(-len(labels) // 4)
    _finish(fig, path, note, rect_bottom=0.08 + 0.04 * rows)


def draw_pool(points, note, path):
    fig = _new_figure()
    ax = fig.add_subplot()
    cores = points["cores"]
    _plot(ax, points["ferry"], "ferry Pool", color=FERRY_ZERO_COPY, marker="o")
    _plot(ax, points["torch"], "torch.multiprocessing.Pool", color=TORCH, marker="^")
    _plot(ax, points["limit"], f"limit: one ferry worker's rate × min(workers, {cores} cores)",
          color=LIMIT, ls="--")
    workers = [w for key in ("ferry", "torch") for w in _xs(points[key])]
    # The core count is marked only inside the measured range: a 64-core machine measured at
    # 1 and 2 workers would otherwise get an axis that is mostly empty.
    if min(workers) <= cores <= max(workers):
        ax.axvline(cores, color=LIMIT, ls=":", lw=1.0, label=f"{cores} cores")
    _count_axis(ax, workers, "worker processes")
    _y_scale(ax, [points["ferry"], points["torch"], points["limit"]])
    if ax.get_yscale() == "linear":
        ax.set_ylim(bottom=0)
    ax.set_ylabel("mlp tasks/s (higher is better)")
    ax.set_title("Pool throughput against workers (built-in mlp task)")
    ax.legend(loc="best")
    _finish(fig, path, note)


# ---------------------------------------------------------------------------------------------
# Driver.


def load(path):
    """The JSON object in `path`; InputError (naming nothing but the problem) if unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise InputError(f"cannot read it: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InputError("not a JSON object")
    return doc


def _plot_bench(doc, out):
    note = machine_note(doc)
    written = []
    rt = round_trip_points(doc)
    tp = throughput_points(doc)
    path = os.path.join(out, ROUND_TRIP)
    draw_round_trip(rt, note, path)
    written.append(path)
    path = os.path.join(out, THROUGHPUT)
    draw_throughput(tp, note, rotating_destinations(doc), path)
    written.append(path)
    return written


def _plot_fanin(doc, out):
    lines, producers = fanin_lines(doc)
    path = os.path.join(out, FANIN)
    draw_fanin(lines, producers, machine_note(doc), path)
    return [path]


def _plot_pool(doc, out):
    path = os.path.join(out, POOL)
    draw_pool(pool_points(doc), machine_note(doc), path)
    return [path]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="SVG plots of ferry's benchmark JSON (round trip, throughput, fan-in, pool).")
    ap.add_argument("--bench", metavar="JSON", help="ferry-bench --json output")
    ap.add_argument("--pool", metavar="JSON", help="ferry-pool-bench --json output")
    ap.add_argument("--fanin", metavar="JSON", help="fan-in benchmark --json output")
    ap.add_argument("--out", metavar="DIR", required=True,
                    help="directory for the SVGs (created if missing)")
    args = ap.parse_args(argv)
    if not (args.bench or args.pool or args.fanin):
        ap.error("nothing to plot: give at least one of --bench, --pool, --fanin")

    jobs = (
        ("--bench", args.bench, (ROUND_TRIP, THROUGHPUT), _plot_bench),
        ("--fanin", args.fanin, (FANIN,), _plot_fanin),
        ("--pool", args.pool, (POOL,), _plot_pool),
    )
    written, failed = [], False
    for option, path, names, plot in jobs:
        which = ", ".join(names)
        if not path:
            print(f"plot_bench: skipped {which}: no {option} given", file=sys.stderr)
            continue
        if not os.path.exists(path):
            print(f"plot_bench: skipped {which}: {path} does not exist", file=sys.stderr)
            continue
        try:
            doc = load(path)
            os.makedirs(args.out, exist_ok=True)
            with matplotlib.rc_context(RC):
                for svg in plot(doc, args.out):
                    print(svg)
                    written.append(svg)
        except InputError as e:
            print(f"plot_bench: {path}: {e}; {which} not written", file=sys.stderr)
            failed = True
        except OSError as e:
            print(f"plot_bench: cannot write into {args.out}: {e}", file=sys.stderr)
            return 1
    if failed:
        return 1
    if not written:
        print("plot_bench: no input found, nothing written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
