"""Unit tests of bench/report/render.py on small synthetic records (python3 standard library).

Each test writes records by hand, renders or computes one figure, and checks it against a value
worked out here from the definitions, so a renamed key, a wrong baseline or a wrong FLOP model
fails. Run: python3 -m unittest -v test_render (from this folder), or through ctest."""
import argparse
import importlib.util
import json
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.environ.get("CTXPAR_RENDER", os.path.join(HERE, "..", "..", "bench", "report", "render.py"))
spec = importlib.util.spec_from_file_location("render", PATH)
render = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render)


def rec(benchmark, case, **fields):
    r = {"benchmark": benchmark, "case": case, "_file": f"{benchmark}.json"}
    r.update(fields)
    return r


# What every step_vs_kernel record carries beside its timings: the warm step's allocations.
STEADY = dict(steady_state_allocations=0, steady_state_calls=3, steady_state_allocation_bytes=0,
              steady_state_allocation_labels="")


def profile_fields(side, pas, wall, labels, other=0.0):
    """A profiled call as bench/common/kernel_profile.hpp writes it: `labels` is [(label, s, launches)]."""
    pre = f"{side}_{pas}_profile_"
    kernels = sum(sec for _, sec, _ in labels) + other
    f = {pre + "wall_s": wall, pre + "kernels_s": kernels, pre + "outside_kernels_s": wall - kernels,
         pre + "other_kernels_s": other, pre + "labels": len(labels)}
    for i, (lab, sec, calls) in enumerate(labels):
        f.update({pre + f"label{i}": lab, pre + f"label{i}_s": sec, pre + f"label{i}_calls": calls})
    return f


# Profiles of a step and of its kernels (one label, the step 0.1 s slower outside kernels).
PROFILES = {k: v for side, wall in (("step", 0.4), ("kernel", 0.3)) for pas in ("forward", "backward")
            for k, v in profile_fields(side, pas, wall, [("ctxpar::kernel", 0.3, 1)]).items()}


def gdn_kernel(**over):
    r = rec("chunkwise", "gdn_local_forward", kind="local_kernel", family="gdn", tokens=256, heads=1,
            key_dim=64, value_dim=32, chunk=16, flop_model="triangular: test", gflops=50.0, sgemm_gflops=200.0,
            chunkwise_median_s=0.002, recurrence_median_s=0.006, forward_ratio=0.25)
    r.update(over)
    return r


class Render(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.args = argparse.Namespace(img=os.path.join(self.tmp.name, "img"), out=os.path.join(self.tmp.name, "p.md"),
                                       command="test", results=self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def render_records(self, recs):
        return render.render(recs, self.args)

    def test_renamed_rate_key_fails_loudly(self):
        r = gdn_kernel()
        r["forward_gflops"] = r.pop("gflops")  # the renderer's old bug, the other way round
        with self.assertRaises(KeyError) as cm:
            self.render_records([r])
        msg = str(cm.exception)
        self.assertIn("'gflops'", msg)
        self.assertIn("gdn_local_forward", msg)
        self.assertIn("chunkwise.json", msg)

    def test_missing_key_in_every_figure_is_a_key_error(self):
        for key in ("dim", "forward_gflops", "backward_ratio", "sgemm_gflops"):
            r = rec("swa", "kernel", kind="local_kernel", dim=64, window=128, forward_gflops=10.0,
                    backward_gflops=8.0, sgemm_gflops=20.0, forward_ratio=0.5, backward_ratio=0.4,
                    forward_flop_formula="f", backward_flop_formula="b")
            del r[key]
            with self.assertRaises(render.RecordKeyError, msg=key) as cm:
                self.render_records([r])
            self.assertIn(f"'{key}'", str(cm.exception))

    def test_projection_uses_the_measured_chunkwise_rate(self):
        text = self.render_records([gdn_kernel(gflops=37.5, sgemm_gflops=200.0),
                                    rec("ceilings", "sgemm_n512", gflops=190.0, flops_formula="2*n^3")])
        self.assertTrue("37.5 GFLOP/s (measured chunkwise kernel" in text, "projection rate is not the kernel's")
        self.assertFalse("190 GFLOP/s (same-run SGEMM (no chunkwise" in text, "projection fell back to SGEMM")

    def test_old_gdn_flop_model_is_converted_to_triangular(self):
        c, k, v = 64, 128, 128
        full = c * c * k + c ** 3 / 3 + 2 * c * c * v + 2 * c * c * k + 2 * c * c * k + 6 * c * k * v + 2 * c * c * v
        tri = c * c * k + c ** 3 / 3 + c * c * v + c * c * k + c * c * k + 6 * c * k * v + c * c * v
        r = gdn_kernel(chunk=c, key_dim=k, value_dim=v, flop_model="gated_delta_chunk_flops: every product at full size",
                       gflops=100.0, sgemm_gflops=160.0)
        row = render.fig_chunk_kernels([r])[0]
        self.assertAlmostEqual(row["gflops"], 100.0 * tri / full)
        self.assertAlmostEqual(row["ratio"], 100.0 * tri / full / 160.0)
        self.assertAlmostEqual(render.fig_chunk_kernels([gdn_kernel(gflops=100.0)])[0]["gflops"], 100.0)

    def test_speedup_is_against_the_fastest_recurrence(self):
        sweep = rec("chunkwise", "gdn_vs_recurrence_C16", kind="gdn_vs_recurrence", family="gdn", tokens=256,
                    heads=1, key_dim=64, value_dim=32, chunk=16, flop_model="triangular: t",
                    chunkwise_median_s=0.002, recurrence_median_s=0.008, flops_per_token_chunkwise=1e6,
                    sgemm_gflops=200.0, local_speedup_vs_recurrence=4.0)
        rows = render.fig_vs_recurrence([sweep, gdn_kernel(recurrence_median_s=0.005)])
        self.assertAlmostEqual(rows[0]["speedup"], 0.005 / 0.002)
        # ceiling: fastest recurrence time over the chunkwise flops at the SGEMM rate
        self.assertAlmostEqual(rows[0]["ceiling"], 0.005 / (1e6 * 256 / 200e9))
        self.assertIsNone(render.recurrence_profile(rows[0]))  # a record written before the profile

    def test_vs_recurrence_profile_gives_each_kernel_its_rate(self):
        # intra_chunk: 2e8 model FLOPs in 2 ms = 100 GFLOP/s = 0.5 of SGEMM; forward_pass 6e8 in 6 ms = 0.5.
        prof = profile_fields("chunkwise", "x", 0.01, [("ctxpar::chunkwise::gated_delta::forward_pass", 0.006, 1),
                                                       ("ctxpar::chunkwise::gated_delta::intra_chunk", 0.002, 1),
                                                       ("ctxpar::chunkwise::gated_delta::gates", 0.001, 1)])
        prof = {k.replace("chunkwise_x_profile_", "chunkwise_profile_"): v for k, v in prof.items()}
        sweep = rec("chunkwise", "gdn_vs_recurrence_C16", kind="gdn_vs_recurrence", family="gdn", tokens=256,
                    heads=1, key_dim=64, value_dim=32, chunk=16, flop_model="triangular: t",
                    chunkwise_median_s=0.01, recurrence_median_s=0.02, flops_per_token_chunkwise=1e6,
                    sgemm_gflops=200.0, local_speedup_vs_recurrence=2.0, intra_chunk_flops=2e8,
                    forward_pass_flops=6e8, **prof)
        row = render.fig_vs_recurrence([sweep])[0]
        by = {lab: (sec, share, rate, of) for lab, sec, share, rate, of in render.recurrence_profile(row)}
        self.assertAlmostEqual(by["`ctxpar::chunkwise::gated_delta::intra_chunk`"][2], 100.0)
        self.assertAlmostEqual(by["`ctxpar::chunkwise::gated_delta::forward_pass`"][3], 0.5)
        self.assertAlmostEqual(by["`ctxpar::chunkwise::gated_delta::forward_pass`"][1], 0.6)
        self.assertIsNone(by["`ctxpar::chunkwise::gated_delta::gates`"][2])  # no FLOPs in the model
        self.assertAlmostEqual(by["outside kernels"][0], 0.001)
        note = {r[0]: r for r in render.summary_rows([sweep])}[
            "chunkwise vs the fastest recurrence (GDN, best chunk size)"][-1]
        self.assertIn("profile at C = 16: `ctxpar::chunkwise::gated_delta::forward_pass` 0.5 of SGEMM (60 % of the "
                      "call)", note)

    def test_cp_efficiency_baselines(self):
        solo = rec("chunkwise", "cp", kind="cp_efficiency", tokens=64, ranks=2, baseline="solo", cp_efficiency=0.95,
                   machine_efficiency_ceiling=0.8)
        old = rec("chunkwise", "cp", kind="cp_efficiency", tokens=64, cp_efficiency=0.95, machine_efficiency_ceiling=0.8,
                  t1_method="each rank runs the whole sequence alone, both at the same time")
        self.assertAlmostEqual(render.fig_cp([solo])[0]["solo_eff"], 0.95)  # ceiling beside it, not folded in
        est = render.fig_cp([old])[0]
        self.assertTrue(est["estimated"])
        self.assertAlmostEqual(est["solo_eff"], 0.95 * 0.8)
        noisy = dict(solo, machine_efficiency_ceiling=1.2)  # all ranks faster than one: impossible
        self.assertFalse(render.fig_cp([noisy])[0]["valid"])
        self.assertTrue(render.fig_cp([solo])[0]["valid"])
        row = {r[0]: r for r in render.summary_rows([noisy])}["CP efficiency at P = 2 × 1 thread — GDN"]
        self.assertEqual(row[4], "not measured")  # the invalid case is not pooled
        bare = dict(old)
        del bare["t1_method"]
        with self.assertRaises(KeyError) as cm:
            render.fig_cp([bare])
        self.assertIn("'baseline'", str(cm.exception))

    def test_cp_profile_shows_the_excess_over_an_even_split(self):
        r = rec("chunkwise", "cp", kind="cp_efficiency", tokens=64, ranks=2, baseline="solo", cp_efficiency=0.8,
                machine_efficiency_ceiling=0.97, two_ranks_profile_max_kernels_s=0.06)
        r.update({k.replace("step_forward", "single_rank"): v for k, v in
                  profile_fields("step", "forward", 0.1, [("ctxpar::local", 0.1, 2)]).items()})
        r.update({k.replace("step_forward", "two_ranks"): v for k, v in
                  profile_fields("step", "forward", 0.08, [("ctxpar::local", 0.05, 2), ("ctxpar::fold", 0.01, 1)])
                  .items()})
        md = render.cp_profile_table(render.fig_cp([r]))
        hs = render.human_seconds
        # at efficiency 1 each label takes half its single-rank time; the fold is all excess
        self.assertIn(f"`ctxpar::local` | {hs(0.1)} | {hs(0.05)} | {hs(0.0)} | 0.0 %", md)
        self.assertIn(f"`ctxpar::fold` | {hs(0.0)} | {hs(0.01)} | {hs(0.01)} | 12.5 %", md)
        self.assertIn(f"outside kernels | {hs(0.0)} | {hs(0.02)} | {hs(0.02)} | 25.0 %", md)
        self.assertIn("kernels-only efficiency 0.833", md)  # 0.1 / (2 * 0.06)
        self.assertIn("outside kernels 25 % of rank 0's T(P) call", md)
        self.assertNotIn("predict efficiency", md)  # an older record without the chain's figures
        r.update(chain_efficiency=0.77, chain_wait_s=0.02, chain_formula="S / (S + F + R), a wait: why")
        self.assertIn(f"the chained state passes predict efficiency 0.77 (S / (S + F + R)) and a wait of "
                      f"{hs(0.02)} per call, rank 0's profiled call spent {hs(0.02)} outside kernels",
                      render.cp_profile_table(render.fig_cp([r])))
        del r["chain_formula"]
        with self.assertRaises(KeyError):
            render.cp_profile_table(render.fig_cp([r]))
        r["chain_formula"] = "S / (S + F + R), a wait: why"
        del r["two_ranks_profile_label1_s"]
        with self.assertRaises(KeyError):
            render.cp_profile_table(render.fig_cp([r]))

    def test_hybrid_efficiency_uses_the_p1_run(self):
        def hyb(p, fwd, bwd):
            layer = {"layer": "gdn", "policy": "GatherFold", "forward_seconds": fwd, "backward_seconds": bwd}
            return rec("hybrid", f"hybrid P={p}", ranks=p, length=64, steps=[{"layers": [layer]}])
        rows = render.fig_cp([hyb(1, 0.3, 0.5), hyb(2, 0.2, 0.3),
                              rec("ceilings", "contention_P2", ranks=2, machine_efficiency_ceiling=0.9)])
        self.assertAlmostEqual(rows[0]["eff"], 0.8 / (2 * 0.5))
        self.assertAlmostEqual(rows[0]["ceiling"], 0.9)
        self.assertEqual(rows[0]["baseline"], "solo")
        self.assertIn("the checked step's one call", rows[0]["case"])
        # With --repeat on both runs: the steady state's medians, not the checked step.
        runs = [hyb(1, 0.3, 0.5), hyb(2, 0.2, 0.3)]
        for r, (f, b) in zip(runs, ((0.2, 0.4), (0.1, 0.2))):
            r["steady_state"] = {"repeat": 5, "layers": [{"layer": "gdn", "forward_median_seconds": f,
                                                          "backward_median_seconds": b}]}
        (row,) = render.fig_cp(runs)
        self.assertAlmostEqual(row["eff"], 0.6 / (2 * 0.3))
        self.assertIn("median of 5 steady-state calls", row["case"])
        del runs[1]["steady_state"]["layers"][0]["backward_median_seconds"]
        with self.assertRaises(KeyError):
            render.fig_cp(runs)

    def test_torch_speedup_is_shown_raw_and_normalised(self):
        mine = rec("swa", "kernel", kind="local_kernel", dim=64, window=128, sgemm_gflops=180.0)
        torch = rec("swa_torch", "torch D=64", dim=64, window=128, sgemm_gflops=120.0, ctxpar_forward_speedup=3.0,
                    ctxpar_backward_speedup=1.5)
        rows = {x["op"]: x for x in render.fig_torch([mine, torch])}
        self.assertAlmostEqual(rows["SWA forward"]["raw"], 3.0)
        self.assertAlmostEqual(rows["SWA forward"]["norm"], 3.0 / 1.5)
        self.assertAlmostEqual(rows["SWA backward"]["norm"], 1.0)
        lone = rec("swa_torch", "torch D=128", dim=128, window=128, sgemm_gflops=120.0, ctxpar_forward_speedup=3.0,
                   ctxpar_backward_speedup=1.5)
        self.assertEqual(len(render.fig_torch([mine, torch, lone])), 2)  # not paired, not invented
        self.assertEqual(render.unpaired_torch([mine, torch, lone]), ["torch D=128"])
        del torch["sgemm_gflops"]
        with self.assertRaises(KeyError):
            render.fig_torch([mine, torch])

    def test_raw_target_beyond_the_sgemm_ceiling_is_named(self):
        # Torch's backward at 100 GFLOP/s: 2x needs 200, above ctxpar's SGEMM of 180 (1.11x of it);
        # its forward at 40 needs 80 (0.444x), within the ceiling.
        mine = rec("swa", "kernel", kind="local_kernel", dim=64, window=128, sgemm_gflops=180.0, forward_ratio=0.6,
                   backward_ratio=0.5, forward_gflops=108.0, backward_gflops=90.0)
        torch = rec("swa_torch", "torch D=64", dim=64, window=128, sgemm_gflops=150.0, ctxpar_forward_speedup=1.5,
                    ctxpar_backward_speedup=0.9, forward_gflops=40.0, backward_gflops=100.0)
        rows = {x["op"]: x for x in render.fig_torch([mine, torch])}
        self.assertAlmostEqual(render.need_gflops(rows["SWA backward"]), 200.0)
        self.assertAlmostEqual(render.raw_target_need(rows["SWA backward"]), 200.0 / 180.0)
        self.assertAlmostEqual(render.raw_target_need(rows["SWA forward"]), 80.0 / 180.0)
        text = render.torch_need_block([mine, torch], "SWA")
        self.assertIn("| SWA backward | D = 64, W = 128 | 100 | 0.667 | 200 | 1.11 | – | missed, above SGEMM |",
                      "".join(text))
        self.assertIn("| SWA forward | D = 64, W = 128 | 40 | 0.267 | 80 | 0.444 | – | missed, below SGEMM |",
                      "".join(text))
        # With the core's FMA peak in the records (250 GFLOP/s): the need as a fraction of it too, in
        # the table and in the summary's note.
        peak = rec("ceilings", "fma_peak", gflops=250.0, lanes=16, chains=12, flops_formula="2*lanes*chains*iterations")
        text = render.torch_need_block([mine, torch, peak], "SWA")
        self.assertIn("| SWA backward | D = 64, W = 128 | 100 | 0.667 | 200 | 1.11 | 0.8 | missed, above SGEMM |", text)
        summary = str(render.summary_rows([mine, torch, peak]))
        self.assertIn("would need the kernel above the same-run SGEMM rate (up to 1.11 × SGEMM, 0.8 of the core's "
                      "FMA peak)", summary)
        self.assertIn("need at most 0.444 × SGEMM (below it", summary)
        # A step backward: 10·D per visible pair and query head over torch's median time.
        step = {"op": "SWA step backward", "ctxpar_sgemm": 100.0,
                "rec": dict(queries=6, window=4, q_heads=1, dim=1, backward_median_s=2.0)}
        self.assertAlmostEqual(render.need_gflops(step), 2.0 * 10.0 * 18 / 2.0 * 1e-9)
        # Chunkwise: the forward by the model torch's record carries; a forward + backward has no count.
        self.assertIsNone(render.raw_target_need({"op": "chunkwise gdn forward + backward", "rec": {},
                                                  "ctxpar_sgemm": 1.0}))
        chunk = {"op": "chunkwise gdn forward", "rec": {"forward_gflops": 30.0}, "ctxpar_sgemm": 100.0}
        self.assertAlmostEqual(render.raw_target_need(chunk), 0.6)
        with self.assertRaises(KeyError):
            render.raw_target_need({"op": "chunkwise gdn forward", "rec": {}, "ctxpar_sgemm": 1.0})

    def test_torch_step_pairs_the_step_a_user_calls_by_shape(self):
        shape = dict(queries=4096, window=1024, q_heads=8, dim=64)
        ceiling = rec("swa", "sgemm ceiling", kind="ceiling", gflops=180.0)
        step = rec("swa", "step vs kernel Hkv=8", kind="step_vs_kernel", kv_heads=8, step_forward_median_s=0.1,
                   step_forward_min_s=0.08, step_backward_median_s=0.5, step_backward_min_s=0.4, **shape)
        torch = rec("swa_torch", "torch step Hkv=8", kind="step", kv_heads=8, sgemm_gflops=120.0,
                    forward_median_s=0.25, forward_min_s=0.24, backward_median_s=0.6, backward_min_s=0.6, **shape)
        rows = {x["op"]: x for x in render.fig_torch([ceiling, step, torch])}
        self.assertAlmostEqual(rows["SWA step forward"]["raw"], 2.5)
        self.assertAlmostEqual(rows["SWA step forward"]["norm"], 2.5 / 1.5)
        self.assertAlmostEqual(rows["SWA step forward"]["raw_of_minima"], 3.0)
        self.assertAlmostEqual(rows["SWA step backward"]["raw"], 1.2)
        gqa = dict(torch, case="torch step Hkv=1", kv_heads=1)
        self.assertEqual(len(render.fig_torch([ceiling, step, torch, gqa])), 2)  # no GQA step to pair with
        self.assertEqual(render.unpaired_torch([ceiling, step, torch, gqa]), ["torch step Hkv=1"])
        with self.assertRaises(KeyError):
            render.fig_torch([step, torch])  # no ctxpar SGEMM in the run: no normalisation invented
        # Visible pairs with no cache: the first W queries see 1..W keys, the rest W each.
        small = dict(queries=6, window=4, q_heads=1, dim=1)
        self.assertEqual(render.step_visible_pairs(small), 1 + 2 + 3 + 4 + 4 + 4)
        row = {"rec": dict(small, forward_median_s=2.0)}
        self.assertAlmostEqual(render.need_gflops(row), 4.0 * 18 / 1.0 * 1e-9)

    def test_default_build_rows_pool_every_call_and_pair_torch_per_build(self):
        common = dict(rounds=3, default_host_isa="avx2", native_host_isa="avx2", cpu="test CPU", threads=1, ranks=1)
        swa = rec("isa", "swa forward", default_s=0.2, native_s=0.19, default_over_native=1.05, torch="1.13",
                  torch_s=0.5, default_speedup_over_torch=2.5, native_speedup_over_torch=2.6, **common)
        gdn = rec("isa", "gdn backward", default_s=0.3, native_s=0.25, default_over_native=1.2, **common)
        rows = {r[0] + " / " + r[1]: r for r in render.summary_rows([swa, gdn])}
        ratio = next(r for k, r in rows.items() if k.startswith("default build ÷"))
        self.assertEqual(ratio[4], "**missed**")  # the worst call (1.2 > 1.15) decides
        self.assertIn("1.2 (worst of 2", ratio[3])
        alone = next(r for r in render.summary_rows([swa]) if r[0] == ratio[0])
        self.assertEqual(alone[4], "**met**")
        vs_torch = next(r for k, r in rows.items() if k.startswith("vs PyTorch CPU — SWA step forward, default"))
        self.assertEqual((vs_torch[3], vs_torch[4]), ("2.5", "**met**"))
        self.assertIn("2.6", vs_torch[6])
        text = "\n".join(render.section_isa([swa, gdn]))
        self.assertIn("| swa forward | 200 ms | 190 ms | 1.05 | – | 500 ms (torch 1.13): 2.5× / 2.6× |", text)
        self.assertIn("| gdn backward | 300 ms | 250 ms | 1.2 | – | – |", text)
        tuned = dict(gdn, native_tune_generic_s=0.24, default_over_native_tune_generic=1.25)
        self.assertIn("| gdn backward | 300 ms | 250 ms | 1.2 | 240 ms (1.25) | – |", "\n".join(render.section_isa([tuned])))
        ranged = dict(swa, default_speedup_over_torch_lowest=1.6, default_speedup_over_torch_highest=2.2)
        self.assertIn("2.5× / 2.6×; default build's rounds 1.6–2.2× |", "\n".join(render.section_isa([ranged])))
        self.assertIn("_No record", "\n".join(render.section_isa([])))
        with self.assertRaises(KeyError):
            render.fig_isa([rec("isa", "swa forward", default_s=0.2)])  # the ratio is recorded, not invented

    def test_pack_ratio_above_the_physical_ceiling_is_invalid_not_pooled(self):
        def pack(p, ratio, rnd):
            return rec("heads", "pack_x", ratio_to_triad=ratio, round=rnd, machine={"ranks": p})
        recs = [pack(2, 0.7, 0), pack(2, 0.8, 1), pack(2, 0.6, 2), pack(6, 0.2, 0), pack(6, 3.5, 1), pack(6, 0.3, 2)]
        rows = {x["P"]: x for x in render.fig_pack(recs)}
        self.assertAlmostEqual(rows[2]["ratio"], 0.7)
        self.assertTrue(rows[2]["valid"])
        self.assertFalse(rows[6]["valid"])
        summary = {r[0]: r for r in render.summary_rows(recs)}
        row = summary["head all-to-all pack/unpack"]
        self.assertEqual(row[4], "**met**")  # only the valid case is judged
        self.assertIn("1 case(s) invalid", row[6])
        self.assertNotIn("contiguous copy", row[6])  # older records without the copy
        # Records with the same-run copy: its median per case, the lowest valid case named.
        for r, c in zip(recs, (0.5, 0.9, 0.6, 0.1, 0.1, 0.1)):
            r.update(copy_gbps=10.0, ratio_to_copy=c)
        rows = {x["P"]: x for x in render.fig_pack(recs)}
        self.assertAlmostEqual(rows[2]["copy_ratio"], 0.6)
        row = {r[0]: r for r in render.summary_rows(recs)}["head all-to-all pack/unpack"]
        self.assertIn("÷ a same-run contiguous copy of the same bytes: 0.6–0.6 (lowest: pack_x, P = 2)", row[6])
        del recs[0]["ratio_to_copy"]
        with self.assertRaises(KeyError):
            render.fig_pack(recs)

    def test_step_over_kernel_is_a_ceiling_and_the_worst_pass_decides(self):
        def step(hkv, fwd, bwd):
            return rec("swa", f"step vs kernel Hkv={hkv}", kind="step_vs_kernel", queries=4096, window=1024,
                       q_heads=8, kv_heads=hkv, dim=64, forward_step_over_kernel=fwd,
                       backward_step_over_kernel=bwd, step_forward_median_s=0.3, kernel_forward_median_s=0.25,
                       **STEADY, **PROFILES)
        rows = [r for r in render.summary_rows([step(8, 1.10, 1.01), step(1, 1.02, 1.09)])
                if r[0].startswith("SWA step")]
        self.assertEqual(rows[0][4], "**met**")
        self.assertTrue(rows[0][3].startswith("1.1 "), rows[0][3])
        rows = [r for r in render.summary_rows([step(8, 1.30, 1.01)]) if r[0].startswith("SWA step")]
        self.assertEqual(rows[0][4], "**missed**")
        with self.assertRaises(KeyError):
            bad = step(8, 1.1, 1.0)
            del bad["backward_step_over_kernel"]
            render.fig_step_vs_kernel([bad])

    @staticmethod
    def step_record(benchmark, case, step_f, kernel_f, step_b, kernel_b, **shape):
        """A step_vs_kernel record as the benches write it: medians and their step ÷ kernel ratios."""
        return rec(benchmark, case, kind="step_vs_kernel", step_forward_median_s=step_f,
                   kernel_forward_median_s=kernel_f, step_backward_median_s=step_b,
                   kernel_backward_median_s=kernel_b, forward_step_over_kernel=step_f / kernel_f,
                   backward_step_over_kernel=step_b / kernel_b, **STEADY, **PROFILES, **shape)

    def gdn_step(self, step_f, kernel_f, step_b, kernel_b):
        return self.step_record("chunkwise", "step vs kernel gdn", step_f, kernel_f, step_b, kernel_b,
                                tokens=2048, heads=1, key_dim=128, value_dim=128, chunk=64)

    def gdp_step(self, step_f, kernel_f, step_b, kernel_b):
        return self.step_record("heads", "step vs kernel gdp_M2", step_f, kernel_f, step_b, kernel_b,
                                tokens=2048, heads=8, headdim=64, groups=2, d_state=64, householder=2, chunk=64)

    def test_step_vs_kernel_ratio_is_step_over_kernel_for_every_mechanism(self):
        rows = {x["mechanism"]: x for x in render.fig_step_vs_kernel(
            [self.gdn_step(0.012, 0.010, 0.030, 0.025), self.gdp_step(0.30, 0.20, 0.34, 0.17)])}
        self.assertEqual(set(rows), {"chunkwise GDN", "heads GDP"})
        self.assertAlmostEqual(rows["chunkwise GDN"]["fwd"], 1.2)
        self.assertAlmostEqual(rows["chunkwise GDN"]["bwd"], 1.2)
        self.assertAlmostEqual(rows["heads GDP"]["fwd"], 1.5)
        self.assertAlmostEqual(rows["heads GDP"]["bwd"], 2.0)  # backward's own ratio, not forward's
        self.assertIn("M = 2", rows["heads GDP"]["case"])
        # The table shows the medians the ratios come from, next to the ratios.
        md = render.step_vs_kernel_table([rows["heads GDP"]])
        for figure in (render.fmt(1.5), render.fmt(2.0), render.fmt(0.30), render.fmt(0.17)):
            self.assertIn(figure, md)

    def test_step_vs_kernel_missing_key_raises(self):
        for make, key in ((self.gdn_step, "backward_step_over_kernel"), (self.gdn_step, "key_dim"),
                          (self.gdp_step, "forward_step_over_kernel"), (self.gdp_step, "householder")):
            bad = make(0.012, 0.010, 0.030, 0.025)
            del bad[key]
            with self.assertRaises(KeyError, msg=key):
                render.fig_step_vs_kernel([bad])
        bad = self.gdp_step(0.30, 0.20, 0.34, 0.17)
        del bad["kernel_backward_median_s"]
        with self.assertRaises(KeyError):
            render.step_vs_kernel_table(render.fig_step_vs_kernel([bad]))

    def test_step_vs_kernel_summary_row_per_mechanism_worst_pass_decides(self):
        swa = rec("swa", "step vs kernel Hkv=8", kind="step_vs_kernel", queries=4096, window=1024, q_heads=8,
                  kv_heads=8, dim=64, forward_step_over_kernel=1.10, backward_step_over_kernel=1.05, **STEADY,
                  **PROFILES)
        recs = [swa, self.gdn_step(0.011, 0.010, 0.026, 0.020), self.gdp_step(0.30, 0.20, 0.34, 0.17)]
        rows = {r[0].split(" step ")[0]: r for r in render.summary_rows(recs) if " step ÷ its local kernels" in r[0]}
        self.assertEqual(set(rows), {"SWA", "chunkwise GDN", "heads GDP"})
        self.assertEqual(rows["SWA"][4], "**met**")
        self.assertEqual(rows["chunkwise GDN"][4], "**missed**")  # backward 1.3 > 1.25, forward 1.1 within
        self.assertTrue(rows["chunkwise GDN"][3].startswith(render.fmt(1.3)), rows["chunkwise GDN"][3])
        self.assertTrue(rows["heads GDP"][3].startswith(render.fmt(2.0)), rows["heads GDP"][3])
        self.assertIn("#b-chunkwise", rows["chunkwise GDN"][5])
        self.assertIn("#c-head", rows["heads GDP"][5])
        # A mechanism without records keeps its row, unmeasured rather than dropped.
        rows = {r[0].split(" step ")[0]: r for r in render.summary_rows([swa]) if " step ÷ its local kernels" in r[0]}
        self.assertEqual(rows["heads GDP"][4], "not measured")

    def test_steady_state_row_counts_every_step_record_and_names_what_allocated(self):
        recs = [self.gdn_step(0.011, 0.010, 0.026, 0.020), self.gdp_step(0.30, 0.20, 0.34, 0.17)]
        row = {r[0]: r for r in render.summary_rows(recs)}["steady-state allocations per forward+backward on a plan"]
        self.assertEqual(row[4], "**met**")
        recs[1].update(steady_state_allocations=4, steady_state_allocation_labels="ctxpar::heads::dq x4")
        row = {r[0]: r for r in render.summary_rows(recs)}["steady-state allocations per forward+backward on a plan"]
        self.assertEqual(row[4], "**missed**")
        self.assertIn("heads GDP: 4", row[6])
        table = render.step_vs_kernel_table(render.fig_step_vs_kernel(recs))
        self.assertIn("ctxpar::heads::dq x4", table)
        del recs[0]["steady_state_allocations"]
        with self.assertRaises(KeyError):
            render.summary_rows(recs)

    def test_step_profile_shows_what_the_step_adds_per_label(self):
        r = self.gdp_step(0.40, 0.25, 0.34, 0.17)
        r.update(profile_fields("step", "forward", 0.4, [("ctxpar::kernel", 0.25, 1), ("ctxpar::conv", 0.1, 1)]))
        r.update(profile_fields("kernel", "forward", 0.25, [("ctxpar::kernel", 0.24, 1)]))
        md = render.step_profile_table(render.fig_step_vs_kernel([r]))
        hs = render.human_seconds
        # a label the kernels never launch: all of it is the step's
        self.assertIn(f"`ctxpar::conv` | 1 | {hs(0.1)} | 25.0 % | {hs(0.0)} | {hs(0.1)} | 25.0 %", md)
        self.assertIn(f"outside kernels |  | {hs(0.05)} | 12.5 % | {hs(0.01)} | {hs(0.04)} | 10.0 %", md)
        self.assertIn(f"**the profiled call** |  | {hs(0.4)} | 100 % | {hs(0.25)} | {hs(0.15)} | 37.5 %", md)
        self.assertEqual(render.step_excess(r, "forward"), "`ctxpar::conv` 25 %, outside kernels 10 %, "
                                                           "`ctxpar::kernel` 3 %")  # 0.01 / 0.4 rounds up
        # the summary row of a missed step names where the step adds most
        row = [x for x in render.summary_rows([r]) if x[0].startswith("heads GDP step")][0]
        self.assertEqual(row[4], "**missed**")
        self.assertIn("forward: the step adds most in `ctxpar::conv` 25 %", row[6])
        del r["kernel_backward_profile_label0_s"]
        with self.assertRaises(KeyError):
            render.step_profile_table(render.fig_step_vs_kernel([r]))

    def test_t_sweep_growth_names_the_label_that_grows_most(self):
        # 512 tokens: 1 µs/token, half in each label. 8192: `chain` doubles per token, `output` stays.
        def sweep(T, chain, output, median):
            r = rec("chunkwise", f"t_sweep_scalar_T{T}", kind="t_sweep", family="scalar", tokens=T,
                    forward_median_s=median)
            r.update({k.replace("x_y_profile_", "profile_"): v for k, v in
                      profile_fields("x", "y", chain + output, [("chain", chain, 1), ("output", output, 1)]).items()})
            return r
        lo, hi = sweep(512, 256e-6, 256e-6, 512e-6), sweep(8192, 8192e-6, 4096e-6, 8192e-6 * 1.5)
        (x,) = render.fig_per_token([lo, hi])
        self.assertAlmostEqual(x["ratio"], 1.5)
        g = x["profile"]
        self.assertAlmostEqual(g["wall_ratio"], 1.5)
        self.assertEqual(g["label"], "chain")
        self.assertAlmostEqual(g["label_ratio"], 2.0)
        self.assertAlmostEqual(g["label_share"], 1.0)
        self.assertIn("grows most: `chain` ×2", render.per_token_profile_note(x))
        # A record whose profile lost a label's time fails loudly.
        del hi["profile_label1_s"]
        with self.assertRaises(KeyError):
            render.fig_per_token([lo, hi])
        # Records without a profile (older runs) still give the ratio, and no note.
        for r in (lo, hi):
            for k in [k for k in r if k.startswith("profile_")]:
                del r[k]
        (x,) = render.fig_per_token([lo, hi])
        self.assertIsNone(x["profile"])
        self.assertEqual(render.per_token_profile_note(x), "")

    def test_verdict_is_the_worst_case(self):
        self.assertEqual(render.verdict([0.95, 0.89], lambda v: v >= 0.9), "**missed**")
        self.assertEqual(render.verdict([0.95, 0.91], lambda v: v >= 0.9), "**met**")
        self.assertEqual(render.verdict([], lambda v: v >= 0.9), "not measured")

    def test_alpha_beta_fit_per_kind_recovers_the_model(self):
        a, b = 3e-6, 1 / 5e9
        recs = []
        for kind, model in (("allgather", render.t_allgather), ("alltoall", render.t_alltoall),
                            ("pingpong", render.t_pingpong)):
            for p in (2, 3, 4, 8):
                for m in (1024, 65536, 1 << 20):
                    recs.append(rec("network", f"{kind}_{m}_{p}", kind=kind, ranks=p, bytes=m,
                                    time_median_s=model(a, b, p, m) * (2.0 if kind == "alltoall" else 1.0)))
        fits = render.fit_network(recs)
        for kind in ("allgather", "pingpong"):
            self.assertAlmostEqual(fits[kind]["alpha"] / a, 1.0, places=6)
            self.assertAlmostEqual(fits[kind]["beta"] / b, 1.0, places=6)
            self.assertLess(fits[kind]["error"], 1e-9)
        self.assertAlmostEqual(fits["alltoall"]["alpha"] / a, 2.0, places=6)
        factors = render.collective_factors(fits)
        self.assertAlmostEqual(factors["alltoall"][1], 2.0, places=6)
        self.assertAlmostEqual(factors["allgather"][0], 1.0, places=6)

    def test_portable_kernels_rows(self):
        r = rec("swa", "portable kernels D=64 W=256", kind="portable_kernels", dim=64, window=256, queries=128,
                q_heads=4, kv_heads=1, threads=2, simd_forward_gflops=40.0, simd_backward_gflops=30.0,
                portable_forward_gflops=10.0, portable_backward_gflops=6.0, portable_over_simd_forward=0.25,
                portable_over_simd_backward=0.2, team1_forward_gflops=10.0, team1_backward_gflops=6.0,
                team2_forward_gflops=9.0, team2_backward_gflops=5.0, team4_forward_gflops=8.0,
                team4_backward_gflops=4.0, bitwise_equal_across_team_sizes=False, check_max_relative_error=1e-6)
        rows = render.portable_rows([r])
        self.assertEqual(len(rows), 1)
        # 4 threads per team cannot run on 2 threads: not a sweep point.
        self.assertEqual([t for t, _, _ in rows[0]["teams"]], [1, 2])
        text = render.portable_block([r])
        self.assertIn("**no**", text)  # a broken bitwise promise shows
        del r["team2_backward_gflops"]
        with self.assertRaises(KeyError):
            render.portable_rows([r])

    def test_broken_record_file_is_an_error(self):
        with open(os.path.join(self.tmp.name, "bad.json"), "w") as f:
            f.write("{not json")
        with self.assertRaises(ValueError):
            render.load_records(self.tmp.name)

    def test_committed_records_render(self):
        results = os.path.join(os.path.dirname(PATH), "..", "results")
        if not os.path.isdir(results):
            self.skipTest("no bench/results")
        text = self.render_records(render.load_records(results))
        self.assertIn("## Summary: every target of the bar", text)
        self.assertNotIn("could not be rendered", text)


def longctx(mech, pas, p, t, ns_median, ns_min, peak, **over):
    r = rec("longctx", f"{mech} {pas} P={p} T={t}", kind="longctx", mechanism=mech, P=p, concurrent_jobs=1, T_per_rank=t,
            repeats=3, median_s=ns_median * t * 1e-9, min_s=ns_min * t * 1e-9, per_token_ns_median=ns_median,
            per_token_ns_min=ns_min, peak_rss_bytes=peak, rss_own_process=True, load_average=0.5)
    r["pass"] = pas
    r.update(over)
    return r


def longctx_sweep(ratio_at_top, a=20 * 2**20, b=12000):
    """SWA at P = 1, both passes: per-token time 100 ns at 1 Ki and 4 Ki, ratio_at_top × that at
    128 Ki (the minimum 10 % lower throughout); peak memory exactly a + b·T."""
    out = []
    for pas in ("forward", "forward+backward"):
        for t, ns in ((1024, 100.0), (4096, 100.0), (131072, 100.0 * ratio_at_top)):
            out.append(longctx("swa", pas, 1, t, ns, 0.9 * ns, a + b * t))
    return out


def longctx_p2_with_control(p2_at_top, control_at_top):
    """SWA forward at P = 2 and its control (two single-rank jobs at once, recorded as P = 1 with
    concurrent_jobs = 2): 100 ns per token at 4 Ki, the given multiples at 128 Ki."""
    out = []
    for t in (4096, 131072):
        top = t == 131072
        out.append(longctx("swa", "forward", 2, t, 100.0 * (p2_at_top if top else 1.0), 90.0, 30 * 2**20 + 12000 * t))
        out.append(longctx("swa", "forward", 1, t, 80.0 * (control_at_top if top else 1.0), 70.0,
                           20 * 2**20 + 12000 * t, concurrent_jobs=2))
    return out


class LongContext(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.args = argparse.Namespace(img=os.path.join(self.tmp.name, "img"), out=os.path.join(self.tmp.name, "p.md"),
                                       command="test", results=self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def summary_line(self, text, what):
        return next(line for line in text.splitlines() if line.startswith("| " + what))

    def test_ratio_is_128k_over_4k_and_memory_fit_recovers_the_constant(self):
        recs = longctx_sweep(1.1)
        rows = render.fig_longctx(recs)
        self.assertEqual(len(rows), 2)
        for x in rows:
            self.assertEqual((x["from"], x["to"]), (4096, 131072))
            self.assertAlmostEqual(x["ratio_median"], 1.1)
            self.assertAlmostEqual(x["ratio_min"], 1.1)
        (m,) = render.fig_longctx_memory(recs)  # one point per process: the forward record
        self.assertAlmostEqual(m["b"], 12000)
        self.assertAlmostEqual(m["a"], 20 * 2**20, delta=1e-3)
        self.assertLess(m["residual"], 1e-12)
        text = render.render(recs, self.args)
        self.assertIn("**met**", self.summary_line(text, "per-token time at 128 Ki ÷ 4 Ki tokens per rank — A: SWA"))
        self.assertIn("b = 12000 B/token", self.summary_line(text, "peak memory per rank linear in T/P"))

    def test_ratio_above_the_target_is_missed_and_named(self):
        text = render.render(longctx_sweep(1.5), self.args)
        self.assertIn("**missed**", self.summary_line(text, "per-token time at 128 Ki ÷ 4 Ki tokens per rank — A: SWA"))
        self.assertIn("**Above the target (1.2)**", text)

    def test_memory_not_linear_is_missed(self):
        recs = longctx_sweep(1.0)
        for r in recs:
            if r["T_per_rank"] == 4096:
                r["peak_rss_bytes"] *= 3  # a bump no straight line goes through
        text = render.render(recs, self.args)
        self.assertIn("**missed**", self.summary_line(text, "peak memory per rank linear in T/P"))

    def test_a_cut_short_sweep_says_so(self):
        recs = [r for r in longctx_sweep(1.0) if r["T_per_rank"] != 131072]
        recs += [longctx("swa", pas, 1, 16384, 100.0, 90.0, 20 * 2**20 + 12000 * 16384)
                 for pas in ("forward", "forward+backward")]
        text = render.render(recs, self.args)
        self.assertIn("sweep cut short: to T = 16384", text)

    def test_missing_key_raises(self):
        for key in ("peak_rss_bytes", "per_token_ns_median", "per_token_ns_min", "T_per_rank", "load_average",
                    "pass", "concurrent_jobs"):
            recs = longctx_sweep(1.0)
            del recs[2][key]
            with self.assertRaises(render.RecordKeyError, msg=key) as cm:
                render.render(recs, self.args)
            self.assertIn(f"'{key}'", str(cm.exception))

    def test_a_miss_names_the_part_of_the_profile_that_grows(self):
        def prof(t, steady_s, growing_s, outside_s):
            r = rec("longctx", f"profile swa forward P=1 T={t}", kind="longctx_profile", mechanism="swa", P=1,
                    concurrent_jobs=1, T_per_rank=t, wall_s=steady_s + growing_s + outside_s, kernels_s=steady_s + growing_s,
                    outside_kernels_s=outside_s, other_kernels_s=0.0, labels=2, label0="steady", label0_s=steady_s,
                    label0_calls=1, label1="growing", label1_s=growing_s, label1_calls=1, load_average=0.5)
            r["pass"] = "forward"
            return r
        # per Ki tokens: steady 1 → 1, growing 0.1 → 0.6, outside 0.1 → 0.1
        profs = [prof(4096, 4.0, 0.4, 0.4), prof(131072, 128.0, 76.8, 12.8)]
        text = render.render(longctx_sweep(1.5) + profs, self.args)
        self.assertIn("×1.42; load 0.5 and 0.5), above the target as timed; the part that grows most is `growing`, 0.1 → 0.6 s per Ki "
                      "tokens (×6, 29.4 % of the call at 128 Ki)", text)

    def test_an_end_run_in_several_processes_is_their_median(self):
        recs = longctx_sweep(1.0)
        # Two more processes at 4 Ki of each pass: medians 90, 100 (the sweep's) and 130 ns per token.
        for pas in ("forward", "forward+backward"):
            for ns in (90.0, 130.0):
                recs.append(longctx("swa", pas, 1, 4096, ns, 0.5 * ns, 20 * 2**20 + 12000 * 4096))
        rows = render.fig_longctx(recs)
        for x in rows:
            lo, hi = x["ends"]
            self.assertEqual((lo["processes"], hi["processes"]), (3, 1))
            self.assertAlmostEqual(lo["spread"], 130.0 / 90.0)
            self.assertAlmostEqual(x["ratio_median"], 1.0)  # 100 / median(90, 100, 130)
            self.assertAlmostEqual(x["ratio_min"], 90.0 / 45.0)  # the minimum of the minima at 4 Ki
        text = render.render(recs, self.args)
        self.assertIn("each end the median of 1–3 processes, whose medians differ by up to ×1.44",
                      self.summary_line(text, "per-token time at 128 Ki ÷ 4 Ki tokens per rank — A: SWA"))
        self.assertIn("×1.44 of 3, one process", text)

    def test_control_is_labelled_and_kept_out_of_the_verdict(self):
        # The control grows 3x, P = 2 stays flat: the verdict is P = 2's alone.
        recs = longctx_p2_with_control(1.0, 3.0)
        rows = {x["label"]: x for x in render.fig_longctx(recs)}
        self.assertEqual(set(rows), {"2", "1 ×2 (control)"})
        self.assertAlmostEqual(rows["1 ×2 (control)"]["ratio_median"], 3.0)
        text = render.render(recs, self.args)
        line = self.summary_line(text, "per-token time at 128 Ki ÷ 4 Ki tokens per rank — A: SWA")
        self.assertIn("**met**", line)
        self.assertIn("its control (2 single-rank jobs at once) 3, P = 2 ÷ control ×0.333", line)
        self.assertNotIn("**Above the target", text)
        # The control's peak memory is not a P = 1 memory point.
        self.assertEqual([m["P"] for m in render.fig_longctx_memory(recs)], [])

    def test_p2_growth_matched_by_its_control_is_the_machines(self):
        text = render.render(longctx_p2_with_control(1.5, 1.45), self.args)
        self.assertIn("**missed**", self.summary_line(text, "per-token time at 128 Ki ÷ 4 Ki tokens per rank — A: SWA"))
        self.assertIn("the control grows ×1.45 from 4 Ki to 128 Ki (×1 by the minimum), P = 2 ×1.5; P = 2 ÷ control "
                      "is 1.25 at 4 Ki and 1.29 at 128 Ki (×1.03). What P = 2 adds stays within the target", text)

    def test_p2_growth_beyond_its_control_is_named(self):
        text = render.render(longctx_p2_with_control(1.5, 1.0), self.args)
        self.assertIn("(×1.5). P = 2 grows beyond its control: the exchange or the CP algorithm's own work adds the "
                      "excess.", text)

    def test_profile_record_without_its_labels_raises(self):
        prof = rec("longctx", "profile swa forward P=1 T=4096", kind="longctx_profile", mechanism="swa",
                   P=1, concurrent_jobs=1, T_per_rank=4096, wall_s=1.0, kernels_s=0.9, outside_kernels_s=0.1, other_kernels_s=0.0,
                   labels=1, label0="ctxpar::swa::attention", label0_s=0.9, load_average=0.5)  # no label0_calls
        prof["pass"] = "forward"
        with self.assertRaises(render.RecordKeyError) as cm:
            render.render(longctx_sweep(1.5) + [prof], self.args)
        self.assertIn("'label0_calls'", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
