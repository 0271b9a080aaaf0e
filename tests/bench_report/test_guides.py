"""Tests of bench/report/guides.py: the measured-figure blocks of the mechanism guides are the
records' (the committed guides agree with the committed bench/results), and a stale or broken
block is named instead of passing silently. Run: python3 -m unittest -v test_guides (from this
folder), or through ctest."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
GUIDES = ("swa.md", "chunkwise.md", "heads.md", "hybrid.md")


def guides(root, *args):
    return subprocess.run([sys.executable, os.path.join(root, "bench", "report", "guides.py"), *args, root],
                          capture_output=True, text=True)


class GuideFigures(unittest.TestCase):
    def setUp(self):
        if not os.path.isdir(os.path.join(ROOT, "bench", "results")):
            self.skipTest("no bench/results")
        # A copy of what the generators read and write: bench/ (scripts and records) and the guides.
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        shutil.copytree(os.path.join(ROOT, "bench"), os.path.join(self.root, "bench"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.makedirs(os.path.join(self.root, "docs"))
        for g in GUIDES:
            shutil.copy(os.path.join(ROOT, "docs", g), os.path.join(self.root, "docs", g))

    def tearDown(self):
        self.tmp.cleanup()

    def edit(self, guide, old, new):
        path = os.path.join(self.root, "docs", guide)
        with open(path) as f:
            text = f.read()
        self.assertIn(old, text)
        with open(path, "w") as f:
            f.write(text.replace(old, new, 1))

    def test_committed_guides_match_the_committed_records(self):
        done = guides(ROOT, "--check")
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)

    def test_a_stale_block_is_named_and_rewritten(self):
        # A figure left from another run inside the SWA CP block.
        self.edit("swa.md", "<!-- swa-cp:begin -->\n", "<!-- swa-cp:begin -->\n| an old row |\n")
        done = guides(self.root, "--check")
        self.assertEqual(done.returncode, 1)
        self.assertIn("docs/swa.md: swa-cp", done.stdout)
        self.assertNotIn("docs/heads.md", done.stdout)
        rewritten = guides(self.root)
        self.assertEqual(rewritten.returncode, 0, rewritten.stderr)
        self.assertIn("1 block(s) rewritten", rewritten.stdout)
        self.assertEqual(guides(self.root, "--check").returncode, 0)

    def test_a_changed_record_makes_its_block_stale(self):
        # A new P = 2 run of the hybrid stack: every layer's forward twice as long.
        path = os.path.join(self.root, "bench", "results", "hybrid_P2.json")
        with open(path) as f:
            recs = json.load(f)
        for r in recs if isinstance(recs, list) else [recs]:
            for step in r["steps"]:
                for layer in step["layers"]:
                    layer["forward_seconds"] *= 2
            for layer in r.get("steady_state", {}).get("layers", []):  # runs made with --repeat
                layer["forward_median_seconds"] *= 2
        with open(path, "w") as f:
            json.dump(recs, f)
        done = guides(self.root, "--check")
        self.assertEqual(done.returncode, 1)
        self.assertIn("docs/hybrid.md: hybrid-figures", done.stdout)

    def test_a_missing_marker_fails_loudly(self):
        self.edit("heads.md", "<!-- heads-bytes:end -->", "")
        done = guides(self.root, "--check")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("heads-bytes:end", done.stdout + done.stderr)


if __name__ == "__main__":
    unittest.main()
