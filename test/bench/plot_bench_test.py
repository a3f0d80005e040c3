"""Checks of plot_bench.py: its extraction functions on small hand-written dicts (peers that did
not run, sizes or worker counts one series lacks, points given out of order, keys missing), and
the whole script on synthetic JSON files: four valid SVGs with the expected legend labels, the
same bytes from a second run, and the exit status and messages for missing or broken inputs.

Needs matplotlib (Debian's python3-matplotlib, importable by /usr/bin/python3). From test/bench:
  /usr/bin/python3 -m unittest plot_bench_test
"""

import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "plot_bench.py")
sys.path.insert(0, HERE)

import plot_bench as pb  # noqa: E402 - found through the path set just above

SVG = "{http://www.w3.org/2000/svg}"


def rt(p50, p99=None):
    return {"round_trip_us": {"p50": p50, "p99": p99 if p99 is not None else 2 * p50, "n": 10}}


def mode(p50, gbs, p99=None):
    return dict(rt(p50, p99), throughput={"messages_per_s": 1000.0, "gb_per_s": gbs, "n": 10})


def bench_entry(size, torch=True):
    # Values scale with the size so that each point can be told apart in the assertions.
    k = size / 4096
    e = {
        "size_bytes": size,
        "size": pb.human_size(size),
        "pipe_1byte": rt(10.0),
        "ferry_zero_copy": mode(5.0 * k, 1.0 * k, p99=9.0 * k),
        "ferry_copy": mode(7.0 * k, 0.5 * k),
        "memcpy": {"messages_per_s": 1.0, "gb_per_s": 20.0 * k, "n": 1},
        "memcpy_rotating": {"messages_per_s": 1.0, "gb_per_s": 15.0 * k, "n": 1,
                            "destinations": 9},
    }
    if torch:
        e["torch_shared"] = mode(500.0 * k, 0.01 * k)
        e["torch_fresh"] = mode(600.0 * k, 0.005 * k)
    return e


def bench_report():
    return {
        "tool": "ferry-bench",
        "date": "2030-01-02T03:04:05Z",
        "machine": {"cpu_model": "Example CPU 9000", "cores": 4, "memory_gib": 16.0},
        "config": {"quick": True},
        "torch": {"status": "ok", "torch_version": "2.6.0"},
        "results": [bench_entry(4096), bench_entry(65536), bench_entry(1048576)],
    }


def fanin_entry(producers, size, torch=True):
    def impl(rate, p99):
        return {"messages_per_s": rate, "gb_per_s": rate * size / 1e9,
                "latency_us": {"p50": p99 / 2, "p99": p99},
                "consumer_cpu_us_per_message": 1.0, "producer_cpu_us_per_message": 1.0}
    e = {"producers": producers, "size_bytes": size, "size": pb.human_size(size),
         "ferry": impl(1000.0 * producers, 10.0 * producers)}
    if torch:
        e["torch"] = impl(100.0 * producers, 500.0 * producers)
    return e


def fanin_report():
    return {
        "tool": "ferry-fanin-bench",
        "date": "2030-01-02T03:04:05Z",
        "machine": {"cores": 8, "cpu_model": "Example CPU 9000"},
        "results": [fanin_entry(p, s) for s in (4096, 1048576) for p in (1, 2, 4, 8)],
    }


def pool_report():
    return {
        "cores": 2,
        "ferry": {"empty_round_trip_us": {"p50": 100.0, "p99": 200.0},
                  "mlp_tasks_per_s": {"1": 200.0, "2": 380.0}},
        "torch": {"mlp_tasks_per_s": {"1": 140.0, "2": 160.0}, "torch_version": "2.6.0"},
    }


class RoundTripPoints(unittest.TestCase):
    def test_every_series_sorted_by_size(self):
        report = bench_report()
        report["results"].reverse()  # the writer's order must not matter
        s = pb.round_trip_points(report)
        self.assertEqual(s["ferry_zero_copy"], [(4096, 5.0), (65536, 80.0), (1048576, 1280.0)])
        self.assertEqual(s["ferry_zero_copy_p99"],
                         [(4096, 9.0), (65536, 144.0), (1048576, 2304.0)])
        self.assertEqual(s["ferry_copy"][0], (4096, 7.0))
        self.assertEqual(s["torch_shared"][-1], (1048576, 500.0 * 256))
        self.assertEqual(s["pipe_1byte"], [(4096, 10.0), (65536, 10.0), (1048576, 10.0)])

    def test_a_peer_that_did_not_run_has_no_points(self):
        report = bench_report()
        report["results"] = [bench_entry(4096, torch=False), bench_entry(65536, torch=False)]
        s = pb.round_trip_points(report)
        self.assertEqual(s["torch_shared"], [])
        self.assertEqual(len(s["ferry_zero_copy"]), 2)

    def test_a_size_one_peer_lacks_leaves_a_gap_in_that_series_only(self):
        report = bench_report()
        del report["results"][1]["torch_shared"]
        s = pb.round_trip_points(report)
        self.assertEqual([x for x, _ in s["torch_shared"]], [4096, 1048576])
        self.assertEqual([x for x, _ in s["ferry_copy"]], [4096, 65536, 1048576])

    def test_a_null_value_is_a_missing_point(self):
        report = bench_report()
        report["results"][0]["ferry_copy"]["round_trip_us"]["p50"] = None
        self.assertEqual([x for x, _ in pb.round_trip_points(report)["ferry_copy"]],
                         [65536, 1048576])

    def test_a_mode_without_its_key_names_the_key(self):
        report = bench_report()
        del report["results"][2]["ferry_zero_copy"]["round_trip_us"]
        with self.assertRaisesRegex(pb.InputError,
                                    r"missing key results\[2\]\.ferry_zero_copy\.round_trip_us"):
            pb.round_trip_points(report)

    def test_no_results_or_no_size_is_an_error(self):
        with self.assertRaisesRegex(pb.InputError, "missing key results"):
            pb.round_trip_points({"tool": "ferry-bench"})
        with self.assertRaisesRegex(pb.InputError, "results is empty"):
            pb.round_trip_points({"results": []})
        report = bench_report()
        del report["results"][1]["size_bytes"]
        with self.assertRaisesRegex(pb.InputError, r"missing key results\[1\]\.size_bytes"):
            pb.round_trip_points(report)


class ThroughputPoints(unittest.TestCase):
    def test_transports_and_limits(self):
        report = bench_report()
        report["results"] = [report["results"][2], report["results"][0]]
        s = pb.throughput_points(report)
        self.assertEqual(s["ferry_zero_copy"], [(4096, 1.0), (1048576, 256.0)])
        self.assertEqual(s["ferry_copy"], [(4096, 0.5), (1048576, 128.0)])
        self.assertEqual(s["torch_shared"], [(4096, 0.01), (1048576, 2.56)])
        self.assertEqual(s["memcpy"], [(4096, 20.0), (1048576, 5120.0)])
        self.assertEqual(s["memcpy_rotating"], [(4096, 15.0), (1048576, 3840.0)])
        self.assertEqual(pb.rotating_destinations(report), 9)

    def test_torch_without_throughput_names_the_key(self):
        report = bench_report()
        del report["results"][0]["torch_shared"]["throughput"]
        with self.assertRaisesRegex(pb.InputError,
                                    r"results\[0\]\.torch_shared\.throughput"):
            pb.throughput_points(report)

    def test_missing_memcpy_at_one_size(self):
        report = bench_report()
        del report["results"][0]["memcpy"]
        self.assertEqual([x for x, _ in pb.throughput_points(report)["memcpy"]],
                         [65536, 1048576])


class FaninLines(unittest.TestCase):
    def test_one_line_per_implementation_and_size_in_order(self):
        report = fanin_report()
        report["results"].reverse()
        lines, producers = pb.fanin_lines(report)
        self.assertEqual(producers, [1, 2, 4, 8])
        self.assertEqual([(line["impl"], line["size_bytes"]) for line in lines],
                         [("ferry", 4096), ("torch", 4096),
                          ("ferry", 1048576), ("torch", 1048576)])
        self.assertEqual(lines[0]["messages_per_s"],
                         [(1, 1000.0), (2, 2000.0), (4, 4000.0), (8, 8000.0)])
        self.assertEqual(lines[1]["p99_us"], [(1, 500.0), (2, 1000.0), (4, 2000.0), (8, 4000.0)])
        self.assertEqual(lines[2]["size"], "1 MiB")

    def test_torch_absent_everywhere_or_at_some_counts(self):
        report = fanin_report()
        report["results"] = [fanin_entry(p, 4096, torch=p < 4) for p in (1, 2, 4)]
        lines, producers = pb.fanin_lines(report)
        self.assertEqual([line["impl"] for line in lines], ["ferry", "torch"])
        self.assertEqual([p for p, _ in lines[1]["messages_per_s"]], [1, 2])
        self.assertEqual(producers, [1, 2, 4])
        report["results"] = [fanin_entry(p, 4096, torch=False) for p in (1, 2)]
        lines, _ = pb.fanin_lines(report)
        self.assertEqual([line["impl"] for line in lines], ["ferry"])

    def test_size_label_made_when_absent(self):
        report = fanin_report()
        for e in report["results"]:
            del e["size"]
        lines, _ = pb.fanin_lines(report)
        self.assertEqual(lines[0]["size"], "4 KiB")

    def test_missing_keys_are_named(self):
        report = fanin_report()
        del report["results"][3]["producers"]
        with self.assertRaisesRegex(pb.InputError, r"missing key results\[3\]\.producers"):
            pb.fanin_lines(report)
        report = fanin_report()
        del report["results"][0]["ferry"]["latency_us"]["p99"]
        with self.assertRaisesRegex(pb.InputError,
                                    r"missing key results\[0\]\.ferry\.latency_us\.p99"):
            pb.fanin_lines(report)


class PoolPoints(unittest.TestCase):
    def test_two_workers_on_two_cores(self):
        p = pb.pool_points(pool_report())
        self.assertEqual(p["ferry"], [(1, 200.0), (2, 380.0)])
        self.assertEqual(p["torch"], [(1, 140.0), (2, 160.0)])
        self.assertEqual(p["limit"], [(1, 200.0), (2, 400.0)])
        self.assertEqual(p["cores"], 2)

    def test_worker_counts_sort_as_numbers_and_the_limit_bends_at_the_cores(self):
        report = pool_report()
        report["cores"] = 3
        report["ferry"]["mlp_tasks_per_s"] = {"10": 500.0, "2": 380.0, "1": 200.0, "4": 550.0}
        p = pb.pool_points(report)
        self.assertEqual([w for w, _ in p["ferry"]], [1, 2, 4, 10])
        self.assertEqual(p["limit"], [(1, 200.0), (2, 400.0), (3, 600.0), (4, 600.0),
                                      (10, 600.0)])

    def test_skipped_torch_and_no_one_worker_rate(self):
        report = pool_report()
        report["torch"] = {"skipped": "/usr/bin/python3 not found"}
        report["ferry"]["mlp_tasks_per_s"] = {"2": 380.0}
        p = pb.pool_points(report)
        self.assertEqual(p["torch"], [])
        self.assertEqual(p["limit"], [])
        self.assertIn("not run: /usr/bin/python3 not found", pb.machine_note(report))

    def test_missing_keys_are_named(self):
        report = pool_report()
        del report["ferry"]["mlp_tasks_per_s"]
        with self.assertRaisesRegex(pb.InputError, "missing key ferry.mlp_tasks_per_s"):
            pb.pool_points(report)
        report = pool_report()
        del report["cores"]
        with self.assertRaisesRegex(pb.InputError, "missing key cores"):
            pb.pool_points(report)
        report = pool_report()
        report["ferry"]["mlp_tasks_per_s"]["two"] = 1.0
        with self.assertRaisesRegex(pb.InputError, "two is not a worker count"):
            pb.pool_points(report)


class Helpers(unittest.TestCase):
    def test_machine_note(self):
        note = pb.machine_note(bench_report())
        self.assertIn("Example CPU 9000, 4 cores, 16.0 GiB memory", note)
        self.assertIn("2030-01-02T03:04:05Z", note)
        self.assertIn("--quick", note)
        self.assertIn("PyTorch 2.6.0", note)
        self.assertIn("Date of the run not recorded", pb.machine_note({"cores": 2}))
        self.assertIn("2 cores", pb.machine_note({"cores": 2}))

    def test_human_size_and_scale(self):
        self.assertEqual([pb.human_size(n) for n in (256, 4096, 1536, 1 << 20, 64 << 20)],
                         ["256 B", "4 KiB", "1.5 KiB", "1 MiB", "64 MiB"])
        self.assertTrue(pb.spans_decades([4096, 65536]))
        self.assertFalse(pb.spans_decades([1, 2, 4]))
        self.assertFalse(pb.spans_decades([0, 100]))


def svg_texts(path):
    """Every piece of text in an SVG (svg.fonttype 'none' keeps text as <text> elements)."""
    root = ET.parse(path).getroot()
    return ["".join(t.itertext()) for t in root.iter(SVG + "text")]


class EndToEnd(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.inputs = {}
        for name, doc in (("bench", bench_report()), ("fanin", fanin_report()),
                          ("pool", pool_report())):
            path = os.path.join(self.tmp.name, name + ".json")
            with open(path, "w") as f:
                json.dump(doc, f)
            self.inputs[name] = path

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                              timeout=120)

    def all_args(self, out):
        return ["--bench", self.inputs["bench"], "--fanin", self.inputs["fanin"],
                "--pool", self.inputs["pool"], "--out", out]

    def test_four_svgs_with_their_legends_and_the_same_bytes_twice(self):
        outs = [os.path.join(self.tmp.name, d) for d in ("a", "b")]
        for out in outs:
            r = self.run_script(*self.all_args(out))
            self.assertEqual(r.returncode, 0, r.stderr)
        names = ["round-trip-vs-size.svg", "throughput-vs-size.svg", "fanin-vs-producers.svg",
                 "pool-vs-workers.svg"]
        self.assertEqual(r.stdout.splitlines(), [os.path.join(outs[1], n) for n in names])
        expected = {
            "round-trip-vs-size.svg": [
                "ferry zero-copy, p50", "ferry zero-copy, p99", "ferry copy-on-send, p50",
                "torch.multiprocessing (shared tensor), p50",
                "limit: 1-byte pipe round trip, p50", "round trip (µs)", "4 KiB", "1 MiB"],
            "throughput-vs-size.svg": [
                "ferry zero-copy", "ferry copy-on-send", "torch.multiprocessing (shared tensor)",
                "limit: memcpy, one core, warm buffers",
                "limit: memcpy into 9 rotating destinations"],
            "fanin-vs-producers.svg": [
                "ferry, 4 KiB", "torch.multiprocessing, 4 KiB", "ferry, 1 MiB",
                "torch.multiprocessing, 1 MiB", "producers (one consumer)", "8"],
            "pool-vs-workers.svg": [
                "ferry Pool", "torch.multiprocessing.Pool",
                "limit: one ferry worker's rate × min(workers, 2 cores)", "2 cores"],
        }
        for name in names:
            with self.subTest(svg=name):
                a, b = (os.path.join(out, name) for out in outs)
                with open(a, "rb") as fa, open(b, "rb") as fb:
                    self.assertEqual(fa.read(), fb.read())
                texts = svg_texts(a)
                for label in expected[name]:
                    self.assertIn(label, texts)
                joined = " ".join(texts)
                self.assertIn("Example CPU 9000" if name != "pool-vs-workers.svg" else "2 cores",
                              joined)
                with open(a, encoding="utf-8") as f:
                    self.assertNotIn("<dc:date>", f.read())

    def test_no_torch_no_torch_line(self):
        report = bench_report()
        report["torch"] = {"status": "skipped", "reason": "--no-torch"}
        for e in report["results"]:
            del e["torch_shared"], e["torch_fresh"]
        with open(self.inputs["bench"], "w") as f:
            json.dump(report, f)
        out = os.path.join(self.tmp.name, "out")
        r = self.run_script("--bench", self.inputs["bench"], "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        texts = svg_texts(os.path.join(out, "round-trip-vs-size.svg"))
        self.assertNotIn("torch.multiprocessing (shared tensor), p50", texts)
        self.assertIn("ferry zero-copy, p50", texts)
        self.assertIn("--no-torch", " ".join(texts))

    def test_a_missing_input_is_skipped_with_its_reason(self):
        out = os.path.join(self.tmp.name, "out")
        missing = os.path.join(self.tmp.name, "nowhere.json")
        r = self.run_script("--pool", self.inputs["pool"], "--fanin", missing, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), [os.path.join(out, "pool-vs-workers.svg")])
        self.assertIn(f"skipped fanin-vs-producers.svg: {missing} does not exist", r.stderr)
        self.assertIn("skipped round-trip-vs-size.svg, throughput-vs-size.svg: no --bench",
                      r.stderr)
        self.assertEqual(sorted(os.listdir(out)), ["pool-vs-workers.svg"])

    def test_nothing_found_is_1_and_bad_arguments_2(self):
        out = os.path.join(self.tmp.name, "out")
        missing = os.path.join(self.tmp.name, "nowhere.json")
        self.assertEqual(self.run_script("--bench", missing, "--out", out).returncode, 1)
        self.assertEqual(self.run_script("--out", out).returncode, 2)
        self.assertEqual(self.run_script("--bench", self.inputs["bench"]).returncode, 2)
        self.assertEqual(self.run_script(*self.all_args(out), "--bogus").returncode, 2)

    def test_an_unreadable_input_is_1_naming_file_and_key(self):
        report = copy.deepcopy(pool_report())
        del report["ferry"]["mlp_tasks_per_s"]
        with open(self.inputs["pool"], "w") as f:
            json.dump(report, f)
        out = os.path.join(self.tmp.name, "out")
        r = self.run_script(*self.all_args(out))
        self.assertEqual(r.returncode, 1)
        self.assertIn(self.inputs["pool"], r.stderr)
        self.assertIn("missing key ferry.mlp_tasks_per_s", r.stderr)
        # The other inputs are still drawn.
        self.assertEqual(len(r.stdout.splitlines()), 3)

        with open(self.inputs["fanin"], "w") as f:
            f.write("{not json")
        r = self.run_script("--fanin", self.inputs["fanin"], "--out", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"{self.inputs['fanin']}: not JSON", r.stderr)


if __name__ == "__main__":
    unittest.main()
