"""Checks of limits_check.py on hand-written JSON: well-formed rows pass and print one line per
figure; each way a limit can be malformed fails, naming the file and the row; a skipped run passes
with a note; a missing file fails unless --missing-ok.

From test/bench:
  /usr/bin/python3 -m unittest limits_check_test
"""

import contextlib
import copy
import io
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import limits_check  # noqa: E402 - found through the path set just above


def limit(**changes):
    base = {"name": "memcpy into rotating destinations, one core", "unit": "GB/s", "value": 20.0,
            "share": 0.75, "source": "measured in this run"}
    base.update(changes)
    return base


def doc(rows, key="rows", tool="example-bench"):
    return {"tool": tool, key: rows}


def good_rows():
    return [
        {"name": "copy, 1 MiB", "limit": limit()},
        {"size": "4 KiB", "limit": [limit(figure="round trip p50", unit="us", share=0.5),
                                    limit(figure="round trip p99", unit="us", share=None,
                                          why="the floor was not measured", value=None)]},
        {"name": "a rate above its ceiling", "limit": limit(share=1.4)},
    ]


class LimitsCheck(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, content, name="bench.json"):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def run_check(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = limits_check.main(list(args))
        return code, out.getvalue(), err.getvalue()

    def assert_fails(self, rows, phrase, row="row 0", key="rows"):
        path = self.write(doc(rows, key))
        code, _, err = self.run_check(path)
        self.assertEqual(code, 1, err)
        self.assertIn(path, err)
        self.assertIn(row, err)
        self.assertIn(phrase, err)

    def test_well_formed_rows_pass_with_a_line_per_figure(self):
        path = self.write(doc(good_rows()))
        code, out, err = self.run_check(path)
        self.assertEqual(code, 0, err)
        self.assertEqual(err, "")
        lines = out.strip().splitlines()
        self.assertEqual(len(lines), 1 + 4)  # the header, then one line per figure
        self.assertTrue(lines[0].startswith("bench"))
        for cell in ("example-bench", "copy, 1 MiB", "memcpy into rotating destinations",
                     "20 GB/s", "0.75"):
            self.assertIn(cell, lines[1])
        self.assertIn("round trip p50", lines[2])
        self.assertIn("4 KiB", lines[2])
        self.assertIn("null", lines[3])
        self.assertIn("(no share: the floor was not measured)", lines[3])
        self.assertIn("1.4", lines[4])

    def test_the_results_list_is_a_row_list_too(self):
        path = self.write(doc(good_rows(), key="results"))
        self.assertEqual(self.run_check(path)[0], 0)

    def test_every_file_given_is_in_one_table_named_by_its_tool_or_file(self):
        a = self.write(doc(good_rows()[:1], tool="first-bench"), "a.json")
        b = self.write({"rows": good_rows()[:1]}, "second-bench.json")
        code, out, _ = self.run_check(a, b)
        self.assertEqual(code, 0)
        self.assertIn("first-bench", out)
        self.assertIn("second-bench", out)
        self.assertEqual(len(out.strip().splitlines()), 3)

    def test_a_skipped_run_passes_with_a_note(self):
        path = self.write({"status": "skipped", "reason": "no CUDA device"})
        code, out, err = self.run_check(path)
        self.assertEqual(code, 0, err)
        self.assertIn("skipped (no CUDA device)", out)

    def test_a_row_without_a_limit_fails(self):
        rows = good_rows()
        del rows[2]["limit"]
        self.assert_fails(rows, "no limit", row="row 2 (a rate above its ceiling)")

    def test_a_row_is_named_by_its_index_without_a_name(self):
        self.assert_fails([{"figure": 1}], "no limit", row="row 0 (#0)")

    def test_a_missing_key_fails(self):
        for key in limits_check.REQUIRED:
            with self.subTest(key=key):
                bad = limit()
                del bad[key]
                self.assert_fails([{"name": "r", "limit": bad}], "missing " + key)

    def test_an_unexpected_key_fails(self):
        self.assert_fails([{"name": "r", "limit": limit(ceiling=3)}], "unexpected key(s) ceiling")

    def test_a_value_that_is_not_a_number_fails(self):
        for value in ("20", True, None, [20.0], float("nan")):
            with self.subTest(value=value):
                self.assert_fails([{"name": "r", "limit": limit(value=value)}], "value")

    def test_a_share_outside_zero_to_ten_fails(self):
        for share in (-0.1, 10.5, 1e9):
            with self.subTest(share=share):
                self.assert_fails([{"name": "r", "limit": limit(share=share)}], "outside [0, 10]")

    def test_the_ends_of_the_share_range_pass(self):
        for share in (0, 10):
            with self.subTest(share=share):
                path = self.write(doc([{"name": "r", "limit": limit(share=share)}]))
                self.assertEqual(self.run_check(path)[0], 0)

    def test_a_share_that_is_not_a_number_fails(self):
        self.assert_fails([{"name": "r", "limit": limit(share="half")}], "not a number")

    def test_a_null_share_without_why_fails(self):
        self.assert_fails([{"name": "r", "limit": limit(share=None)}], "null without a why")
        self.assert_fails([{"name": "r", "limit": limit(share=None, why="")}], "without a why")

    def test_empty_words_fail(self):
        for key in ("name", "unit", "source"):
            with self.subTest(key=key):
                self.assert_fails([{"name": "r", "limit": limit(**{key: ""})}], key)

    def test_a_limit_in_a_list_must_name_its_figure(self):
        self.assert_fails([{"name": "r", "limit": [limit(figure="p50"), limit()]}],
                          "limit 1: a limit in a list names no figure")

    def test_an_empty_list_or_another_type_fails(self):
        self.assert_fails([{"name": "r", "limit": []}], "an empty list of limits")
        self.assert_fails([{"name": "r", "limit": 3.0}], "neither an object nor a list")
        self.assert_fails([{"name": "r", "limit": [3.0]}], "not an object")

    def test_every_bad_row_is_named(self):
        rows = copy.deepcopy(good_rows())
        del rows[0]["limit"]
        rows[1]["limit"][0]["share"] = 11
        path = self.write(doc(rows))
        code, _, err = self.run_check(path)
        self.assertEqual(code, 1)
        self.assertIn("row 0 (copy, 1 MiB): no limit", err)
        self.assertIn("row 1 (4 KiB): limit 0: share 11 is outside", err)

    def test_a_file_without_rows_fails(self):
        for content in ({"tool": "x"}, {"rows": []}, [1, 2], "not json"):
            with self.subTest(content=content):
                path = self.write(content)
                code, _, err = self.run_check(path)
                self.assertEqual(code, 1)
                self.assertIn(path, err)

    def test_a_missing_file_fails_unless_missing_ok(self):
        missing = os.path.join(self.dir.name, "absent.json")
        good = self.write(doc(good_rows()))
        code, _, err = self.run_check(good, missing)
        self.assertEqual(code, 1)
        self.assertIn("absent.json: no such file", err)
        code, out, err = self.run_check("--missing-ok", good, missing)
        self.assertEqual(code, 0, err)
        self.assertIn("absent.json: not there", out)
        self.assertIn("copy, 1 MiB", out)

    def test_good_rows_print_even_when_another_fails(self):
        rows = good_rows()
        del rows[2]["limit"]
        code, out, _ = self.run_check(self.write(doc(rows)))
        self.assertEqual(code, 1)
        self.assertIn("copy, 1 MiB", out)


if __name__ == "__main__":
    unittest.main()
