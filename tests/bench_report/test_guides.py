"""Tests of bench/report/guides.py: the measured-figure blocks of the mechanism guides are the
records' (the committed guides agree with the committed bench/results), and a stale or broken
block is named instead of passing silently. And of the report's shape: docs/performance.md stays a
report (bounded size, one section per mechanism), its detail lives in the guides' blocks and only
there, and every link into it resolves. Run: python3 -m unittest -v test_guides (from this folder),
or through ctest."""
import argparse
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
GUIDES = ("swa.md", "chunkwise.md", "heads.md", "hybrid.md")
RENDER = os.path.join(ROOT, "bench", "report", "render.py")
spec = importlib.util.spec_from_file_location("render", RENDER)
render = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render)

# The report must stay readable as a report: the issue that split it set this bound.
REPORT_MAX_BYTES = 60_000
# Its top-level sections, in order: the summary and its definitions, one section per mechanism, then
# the measures that span the mechanisms. A new one is a decision, not a side effect.
REPORT_SECTIONS = [
    "Summary: every target of the bar", "Definitions (every figure below, every benchmark)",
    "Machine and ceilings", "A: sliding-window attention", "B: chunkwise linear attention",
    "C: head-parallel all-to-all", "CP efficiency", "Long context: cost per token and memory per rank",
    "The hybrid stack (`ctxpar hybrid`)", "Default build against -march=native", "Expression templates",
    "Latency–bandwidth (α–β) model, fitted per collective kind",
    "Projection to P = 8 … 1024 and L up to 1M tokens"]


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


def headings(text):
    """(level, text) of every Markdown heading outside fenced code."""
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            m = re.match(r"(#{1,6}) (.+)", line)
            if m:
                out.append((len(m.group(1)), m.group(2).strip()))
    return out


def anchors(text):
    """Every anchor GitHub gives the headings of `text` (a repeated one gets -1, -2, …)."""
    out, seen = set(), {}
    for _, h in headings(text):
        a = render.anchor(h)
        out.add(a if a not in seen else f"{a}-{seen[a]}")
        seen[a] = seen.get(a, 0) + 1
    return out


def read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def data_rows(md):
    """The data rows of the Markdown tables in `md` (no header or separator lines)."""
    rows, prev = [], ""
    for line in md.splitlines():
        if line.startswith("|") and not line.startswith("|---") and prev.startswith("|"):
            rows.append(line)
        prev = line
    return rows


class ReportLayout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        results = os.path.join(ROOT, "bench", "results")
        if not os.path.isdir(results):
            raise unittest.SkipTest("no bench/results")
        cls.tmp = tempfile.TemporaryDirectory()
        docs = os.path.join(cls.tmp.name, "docs")
        args = argparse.Namespace(img=os.path.join(docs, "img"), out=os.path.join(docs, "performance.md"),
                                  command="scripts/bench", results=results)
        os.makedirs(docs)
        cls.recs = render.load_records(results)
        cls.report = render.render(cls.recs, args)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_report_is_at_most_60_kb(self):
        self.assertLessEqual(len(self.report.encode()), REPORT_MAX_BYTES)
        self.assertLessEqual(os.path.getsize(os.path.join(ROOT, "docs", "performance.md")), REPORT_MAX_BYTES)

    def test_one_top_level_section_per_mechanism(self):
        top = [h for level, h in headings(self.report) if level == 2]
        self.assertEqual(top, REPORT_SECTIONS)
        for mech in ("A:", "B:", "C:"):
            self.assertEqual(len([h for h in top if h.startswith(mech)]), 1, mech)

    @unittest.skipIf(shutil.which("gnuplot") is None, "the report's plot links need gnuplot to be drawn")
    def test_committed_report_matches_the_records(self):
        self.assertEqual(self.report, read("docs", "performance.md"),
                         "docs/performance.md differs from the records: run scripts/bench --render-only")

    def test_every_detail_block_sits_under_the_heading_the_report_links_to(self):
        guides = {g: read("docs", g) for g, _, _, _ in render.GUIDE_BLOCKS}
        for guide, name, heading, _ in render.GUIDE_BLOCKS:
            text = guides[guide]
            self.assertIn(f"({guide}#{render.anchor(heading)})", self.report, f"no link to {guide}: {heading}")
            at = [i for i, line in enumerate(text.splitlines()) if re.fullmatch(r"#{2,3} " + re.escape(heading), line)]
            self.assertEqual(len(at), 1, f"{guide} must hold the heading '{heading}' once")
            lines = text.splitlines()
            level = len(lines[at[0]].split(" ")[0])
            end = next((i for i in range(at[0] + 1, len(lines))
                        if re.match(r"#{1,%d} " % level, lines[i])), len(lines))
            self.assertIn(f"<!-- {name}:begin -->", lines[at[0]:end], f"{guide}: {name} is not under '{heading}'")

    def test_the_report_leaves_the_detail_to_the_guides(self):
        # One home: no data row of a detail block is repeated in the report.
        for guide, name, _, make in render.GUIDE_BLOCKS:
            block = make(self.recs, None)
            rows = data_rows(block)
            self.assertTrue(rows, f"{guide}: {name} has no table")
            for row in rows:
                self.assertNotIn(row, self.report, f"{guide}: {name} is repeated in the report")

    def test_every_link_into_the_report_resolves(self):
        targets = anchors(read("docs", "performance.md"))
        for a in re.findall(r"\]\(#([^)]+)\)", read("docs", "performance.md")):
            self.assertIn(a, targets, f"docs/performance.md links to #{a}")
        sources = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")] + \
            sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
        for path in sources:
            with open(path) as f:
                for a in re.findall(r"performance\.md#([^)\s]+)\)", f.read()):
                    self.assertIn(a, targets, f"{os.path.relpath(path, ROOT)} links to performance.md#{a}")

    def test_the_renderer_cites_only_documents_in_the_repository(self):
        for path in (RENDER, os.path.join(ROOT, "bench", "report", "guides.py")):
            with open(path) as f:
                src = f.read()
            for outside in ("../shared", "50-performance.md", "21-chunkwise-kernels.md", "design doc"):
                self.assertNotIn(outside, src, f"{os.path.basename(path)} cites {outside}")


if __name__ == "__main__":
    unittest.main()
