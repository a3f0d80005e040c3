"""The soak's pure decisions, a case each (python3 -m unittest test_figures)."""

import unittest

import figures

MIB = figures.MIB


class MemoryTarget(unittest.TestCase):
    def test_twice_the_kept_results_plus_a_step_per_worker(self):
        self.assertEqual(figures.memory_target(10 * MIB, 4, 64 * MIB), 20 * MIB + 256 * MIB)

    def test_nothing_kept_leaves_the_workers_steps(self):
        self.assertEqual(figures.memory_target(0, 2, 64 * MIB), 128 * MIB)

    def test_a_dead_workers_pinned_segment_is_over_it(self):
        # 4 live workers, nothing kept, and one 64 MiB segment of a dead worker still mapped.
        self.assertGreater(5 * 64 * MIB, figures.memory_target(0, 4, 64 * MIB))


class HeldTarget(unittest.TestCase):
    def test_adds_the_supervisors_own_arena_and_the_small_segments(self):
        self.assertEqual(figures.held_target(10 * MIB, 4, 64 * MIB),
                         20 * MIB + 5 * 64 * MIB + figures.HELD_OVERHEAD)

    def test_a_dead_workers_segment_still_mapped_is_over_it(self):
        healthy = 5 * 64 * MIB + 4 * MIB  # own arena, 4 live workers', ledgers and queues
        self.assertLessEqual(healthy, figures.held_target(0, 4, 64 * MIB))
        self.assertGreater(healthy + 64 * MIB, figures.held_target(0, 4, 64 * MIB))


class LongestOver(unittest.TestCase):
    def test_never_over_is_zero(self):
        self.assertEqual(figures.longest_over([(0, 1), (0.02, 2)], 5), 0)

    def test_one_sample_over_is_a_hand_over_not_a_stretch(self):
        self.assertEqual(figures.longest_over([(0, 1), (0.02, 9), (0.04, 1)], 5), 0)

    def test_a_stretch_runs_from_its_first_to_its_last_sample_over(self):
        samples = [(0, 9), (0.1, 9), (0.2, 1), (1.0, 9), (1.3, 9), (1.5, 9), (1.6, 1)]
        self.assertAlmostEqual(figures.longest_over(samples, 5), 0.5)

    def test_a_pinned_segment_is_over_for_the_rest_of_the_run(self):
        samples = [(t / 10, 1 if t < 5 else 9) for t in range(30)]
        self.assertGreater(figures.longest_over(samples, 5), figures.PINNED_AFTER_S)


class GrowthPerUnit(unittest.TestCase):
    def test_steady_growth_is_its_slope(self):
        self.assertAlmostEqual(figures.growth_per_unit([(0, 100), (1, 156), (2, 212)]), 56)

    def test_flat_memory_grows_by_nothing(self):
        self.assertAlmostEqual(figures.growth_per_unit([(0, 7), (5, 7), (9, 7)]), 0)

    def test_one_kill_count_has_no_slope(self):
        self.assertIsNone(figures.growth_per_unit([(3, 1), (3, 2)]))
        self.assertIsNone(figures.growth_per_unit([]))


class Percentiles(unittest.TestCase):
    def test_of_values(self):
        p = figures.percentiles([5, 1, 3, 2, 4])
        self.assertEqual((p["p50"], p["max"]), (3, 5))

    def test_of_nothing(self):
        self.assertIsNone(figures.percentiles([]))


class FuzzStats(unittest.TestCase):
    CLEAN = ("#1024\tpulse  cov: 80 ft: 200 corp: 40/2Kb exec/s: 512 rss: 40Mb\n"
             "Done 123456 runs in 31 second(s)\n"
             "stat::number_of_executed_units: 123456\n"
             "stat::average_exec_per_sec:     3982\n"
             "stat::new_units_added:          17\n"
             "stat::peak_rss_mb:              41\n")

    def test_a_clean_run_gives_its_figures_and_no_crash(self):
        stats, crashed = figures.fuzz_stats(self.CLEAN)
        self.assertEqual(stats["number_of_executed_units"], 123456)
        self.assertEqual(stats["new_units_added"], 17)
        self.assertFalse(crashed)

    def test_a_sanitizer_report_is_a_crash(self):
        log = self.CLEAN + "==42==ERROR: AddressSanitizer: heap-buffer-overflow on address\n"
        self.assertTrue(figures.fuzz_stats(log)[1])

    def test_a_deadly_signal_is_a_crash(self):
        self.assertTrue(figures.fuzz_stats("==42== ERROR: libFuzzer: deadly signal\n")[1])

    def test_an_undefined_behaviour_report_is_a_crash(self):
        log = "SUMMARY: UndefinedBehaviorSanitizer: undefined-behavior wire.cpp:10:5\n"
        self.assertTrue(figures.fuzz_stats(log)[1])


class LogCounts(unittest.TestCase):
    LOG = ("[ferry 9 warning] worker 1 (cpu, pid 24) exited with code 1\n"
           "ferry-worker 24: ferry: ledger_full: all 65536 lease slots are held\n"
           "[ferry 9 warning] worker 2 (cpu, pid 41) killed by the supervisor: it sent a result "
           "the supervisor could not read (x)\n"
           "[ferry 9 warning] worker 3 (cpu, pid 34) killed by SIGKILL\n"
           "[ferry 9 warning] worker 0 (cpu, pid 35) killed by SIGKILL\n"
           "[ferry 9 error] worker 3 (cpu) ended during its start-up, killed by SIGKILL; its own "
           "message, if any, is on stderr above; giving up on worker 3 after 5 failed starts\n"
           "terminate called without an active exception\n")

    def test_counts_how_workers_ended(self):
        ends = figures.log_counts(self.LOG)["worker_ends"]
        self.assertEqual(ends, {"exited with code 1": 1, "killed by the supervisor": 1,
                                "killed by SIGKILL": 2})

    def test_counts_the_known_failure_marks(self):
        marks = figures.log_counts(self.LOG)["markers"]
        for m in ("ended during its start-up", "giving up on worker", "ledger_full",
                  "terminate called"):
            self.assertEqual(marks[m], 1, m)

    def test_a_quiet_log_counts_nothing(self):
        self.assertEqual(figures.log_counts(""), {"worker_ends": {}, "markers": {}})


class Formatting(unittest.TestCase):
    def test_bytes(self):
        self.assertEqual(figures.fmt_bytes(512), "512 B")
        self.assertEqual(figures.fmt_bytes(1536), "1.5 KiB")
        self.assertEqual(figures.fmt_bytes(3 * 1024 * MIB), "3.0 GiB")
        self.assertEqual(figures.fmt_bytes(None), "-")

    def test_the_table_has_a_row_per_scenario_with_its_verdict(self):
        t = figures.table([{"name": "a", "passed": True, "seconds": 1.0, "headline": "fine"},
                           {"name": "bb", "passed": False, "seconds": 12.0, "headline": "bad"}])
        lines = t.splitlines()
        self.assertEqual(len(lines), 4)
        self.assertIn("PASS", lines[2])
        self.assertIn("FAIL", lines[3])


if __name__ == "__main__":
    unittest.main()
