"""Checks of cuda_peer.py that need no GPU: what ferry-cuda-bench relies on when it runs it.

- Where torch sees no CUDA device it answers {"skipped": reason} and exits 0, so the benchmark
  shows the reason instead of a failure (forced here with CUDA_VISIBLE_DEVICES="").
- Bad counts are refused before anything runs, with no JSON the benchmark could mistake.
- Its whole protocol (spawn, queues, pipe, the hand-shakes that end each measurement) runs on
  CPU tensors with --device cpu and prints every key ferry-cuda-bench reads.
- Its percentiles are the nearest-rank ones cuda_bench.cpp computes.

Run with the interpreter the benchmark uses: python3 cuda_peer_test.py
"""

import importlib.util
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "cuda_peer.py")


def run_peer(*args, env=None):
    return subprocess.run([sys.executable, PEER, *args], capture_output=True, text=True,
                          timeout=240, env=env)


def has_torch():
    return importlib.util.find_spec("torch") is not None


class CudaPeer(unittest.TestCase):
    def test_no_device_is_a_skip_with_its_reason(self):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        r = run_peer("--quick", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual(list(out), ["skipped"])
        self.assertIsInstance(out["skipped"], str)
        self.assertIn("torch", out["skipped"])
        self.assertIn(sys.executable, out["skipped"])

    def test_bad_counts_are_refused(self):
        for args in (["--opens", "0"], ["--round-trips", "-3"], ["--copies", "many"],
                     ["--copy-bytes", "6"], ["--device", "tpu"]):
            r = run_peer(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertEqual(r.stdout, "", args)

    @unittest.skipUnless(has_torch(), "torch is not importable by this interpreter")
    def test_cpu_protocol_prints_every_key_the_benchmark_reads(self):
        r = run_peer("--device", "cpu", "--quick", "--round-trips", "20", "--copy-bytes",
                     str(1 << 20))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = json.loads(r.stdout)
        for key in ("torch", "torch_cuda", "device", "python", "executable", "start_method"):
            self.assertIn(key, out)
        self.assertEqual(out["start_method"], "spawn")
        numbers = {"handoff": ("p50_us", "p99_us"), "handoff_dropped": ("p50_us", "p99_us"),
                   "first_open": ("open_recv_us", "cached_recv_us"),
                   "copy": ("copy_on_send_GBps", "device_memcpy_GBps", "ratio")}
        for measure, keys in numbers.items():
            self.assertNotIn("status", out[measure], out[measure])
            for key in keys:
                self.assertGreater(out[measure][key], 0, (measure, key))
        self.assertEqual(out["handoff"]["n"], 20)
        self.assertEqual(out["first_open"]["n"], 5)
        self.assertEqual(out["copy"]["n"], 3)
        self.assertEqual(out["copy"]["bytes"], 1 << 20)

    def test_percentiles_are_nearest_rank(self):
        spec = importlib.util.spec_from_file_location("cuda_peer", PEER)
        peer = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(peer)
        values = list(range(2000, 0, -1))  # 1..2000, unsorted
        self.assertEqual(peer.percentile(values, 50), 1000)
        self.assertEqual(peer.percentile(values, 99), 1980)
        self.assertEqual(peer.percentile([3.0, 1.0, 2.0], 50), 2.0)
        self.assertEqual(peer.percentile([5.0] + [1.0] * 49, 99), 5.0)
        self.assertIsNone(peer.percentile([], 50))


if __name__ == "__main__":
    unittest.main()
