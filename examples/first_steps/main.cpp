// Your first distributed calls: one operator of each ctxpar mechanism, each checked on every rank
// against the same operator run on a one-rank group.
//
//   1. sliding-window attention: a two-step stream with a carried cache, forward and backward
//      (a swa::StepPlan's forward / backward, run again on a one-rank group built from
//      MPI_COMM_SELF);
//   2. chunkwise gated delta rule (GDN) over two packed sequences, forward and backward
//      (a ctxpar::chunkwise::CpPlan's forward / backward, run again on a one-rank group built
//      from MPI_COMM_SELF);
//   3. head-parallel transposes of a Gated Delta Product input projection
//      (ctxpar::heads::TransposePlan: to_head_parallel, to_sequence_parallel, the adjoint).
//
// Run: mpirun -np 2 ./first_steps   (any rank count; uneven and empty shards are fine).
// Every rank prints its largest differences; the exit status is non-zero if any check fails.
#include <Kokkos_Core.hpp>
#include <array>
#include <boost/mpi/environment.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctxpar/ctxpar.hpp>  // everything; or ctxpar/swa/swa.hpp, ctxpar/chunkwise/driver.hpp, ...
#include <string>
#include <utility>
#include <vector>

using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;
using real = double;  // float works the same way (looser tolerances below)

// A deterministic value in [-1, 1) for element `i` of input `seed`: every rank can build any part
// of the same global data, so each builds its own shard and the whole input for the reference.
real value(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + i + 1;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<real>(x >> 11) / static_cast<real>(1ull << 52) - 1.0;
}

// Rows [row0, row0 + n) of a global token-major tensor [T, heads, dim]. Both mechanisms A and B
// take rank-3 LayoutRight views (ctxpar::swa::Tensor, ctxpar::chunkwise::token_view).
using Tensor = Kokkos::View<real***, Kokkos::LayoutRight, mem>;
Tensor tensor(const std::string& label, std::uint64_t seed, std::int64_t row0, std::int64_t n,
              std::int64_t heads, std::int64_t dim) {
  Tensor t(label, n, heads, dim);
  auto host = Kokkos::create_mirror_view(t);  // fill on the host, copy to the device (if any)
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t d = 0; d < dim; ++d)
        host(i, h, d) = value(seed, static_cast<std::uint64_t>(((row0 + i) * heads + h) * dim + d));
  Kokkos::deep_copy(t, host);
  return t;
}

// max |mine(i) - whole(offset + i)| / max |whole|: compares this rank's rows with the matching
// rows of the single-rank result.
template <class Mine, class Whole>
double rel_diff(const Mine& mine, const Whole& whole, std::int64_t offset) {
  auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), mine);
  auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), whole);
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < b.span(); ++i) scale = std::fmax(scale, std::fabs(b.data()[i]));
  for (std::size_t i = 0; i < a.extent(0); ++i)
    for (std::size_t j = 0; j < a.extent(1); ++j)
      for (std::size_t k = 0; k < a.extent(2); ++k)
        diff = std::fmax(diff, std::fabs(a(i, j, k) - b(offset + i, j, k)));
  return scale > 0 ? diff / scale : diff;
}

// Prints one rank's line and turns it into an exit status.
int report(const char* part, int rank, const std::vector<std::pair<const char*, double>>& diffs,
           const std::vector<double>& bounds) {
  bool ok = true;
  std::printf("rank %d %-6s", rank, part);
  for (std::size_t i = 0; i < diffs.size(); ++i) {
    std::printf(" %s %.2g", diffs[i].first, diffs[i].second);
    ok = ok && diffs[i].second <= bounds[i];
  }
  std::printf("  %s\n", ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}

// 1. Sliding-window attention (docs/swa.md): a stream of two chunks of t tokens, window W, with
// the carried cache of raw keys/values, forward then the chained backward.
int swa_part(const ctxpar::Group& group) {
  namespace swa = ctxpar::swa;
  const std::int64_t t = 11, hq = 4, hkv = 2, d = 8, steps = 2;  // Hq % Hkv == 0, D even
  const int me = group.rank();
  const ctxpar::BalancedChunks shard{t, group.size()};  // this rank's queries of every chunk
  swa::Options opt;
  opt.window = 5;  // keys at positions (pos - 5, pos]; the cache keeps W - 1 = 4 tokens

  // Tokens [row0, row0 + n) of chunk `step`: raw q, k, v, absolute positions, no document ids.
  auto chunk = [&](std::int64_t step, std::int64_t row0, std::int64_t n) {
    const std::int64_t first = step * t + row0;  // index in the whole stream
    swa::Chunk<real, mem> c{tensor("q", 1, first, n, hq, d), tensor("k", 2, first, n, hkv, d),
                            tensor("v", 3, first, n, hkv, d), swa::Positions<mem>("pos", n),
                            swa::Ids<mem>()};  // empty ids: one document
    auto pos = Kokkos::create_mirror_view(c.pos);
    for (std::int64_t i = 0; i < n; ++i) pos(i) = first + i;
    Kokkos::deep_copy(c.pos, pos);
    return c;
  };
  auto dout = [&](std::int64_t step, std::int64_t row0, std::int64_t n) {
    return tensor("dout", 4, step * t + row0, n, hq, d);
  };

  // A stream through a plan: built once (collectively) on `g`, it runs every step; every rank
  // passes its BalancedChunks(t, P) share of each chunk. The caller owns the carried caches
  // (sharded over the ranks), the outputs and gradients, and one saved state per step.
  struct Stream {
    std::vector<swa::Tensor<real, mem>> outs;
    std::vector<swa::StepGradients<real, mem>> grads;
  };
  auto stream = [&](const ctxpar::Group& g) {
    const ctxpar::BalancedChunks mine{t, g.size()};
    const std::int64_t row0 = mine.begin(g.rank()), n = mine.size(g.rank());
    swa::StepPlan<swa::HaloKV, swa::SegmentChunks, exec, real> plan(exec(), g, {hq, hkv, d}, opt);
    std::vector<swa::Cache<real, mem>> caches(steps + 1);  // caches[s]: the input of step s
    caches[0] = swa::empty_cache<real, mem>(hkv, d);
    std::vector<swa::DistributedState<real, mem>> saved(steps);
    Stream r{std::vector<swa::Tensor<real, mem>>(steps),
             std::vector<swa::StepGradients<real, mem>>(steps)};
    for (std::int64_t s = 0; s < steps; ++s) {
      r.outs[s] = swa::allocate_output<real, mem>(plan.shape(), n);
      plan.forward(chunk(s, row0, n), caches[s], r.outs[s], caches[s + 1], saved[s]);
    }
    swa::CacheGradient<real, mem> carried;  // empty for the last step
    for (std::int64_t s = steps - 1; s >= 0; --s) {
      r.grads[s] = swa::allocate_gradients(plan.shape(), saved[s]);  // sized as the step's shards
      plan.backward(saved[s], dout(s, row0, n), carried, r.grads[s]);
      carried = {r.grads[s].dk_cache, r.grads[s].dv_cache};
    }
    return r;
  };
  const Stream dist = stream(group);
  // Reference: the same plan on a one-rank group, over the whole chunks (every rank runs it).
  const Stream whole = stream(ctxpar::Group(MPI_COMM_SELF));

  // The forward is bitwise identical for every rank count (docs/swa.md); gradients sum the
  // same terms in another order (reduce-scatter), so they agree to a few ulps.
  double out = 0, dq = 0, dk = 0, dv = 0;
  for (std::int64_t s = 0; s < steps; ++s) {
    out = std::fmax(out, rel_diff(dist.outs[s], whole.outs[s], shard.begin(me)));
    dq = std::fmax(dq, rel_diff(dist.grads[s].dq, whole.grads[s].dq, shard.begin(me)));
    dk = std::fmax(dk, rel_diff(dist.grads[s].dk, whole.grads[s].dk, shard.begin(me)));
    dv = std::fmax(dv, rel_diff(dist.grads[s].dv, whole.grads[s].dv, shard.begin(me)));
  }
  const double tol = 1e-12;  // fp64; about 1e-5 for float
  return report("swa", me, {{"out", out}, {"dq", dq}, {"dk", dk}, {"dv", dv}},
                {0.0, tol, tol, tol});
}

// 2. Chunkwise gated delta rule (docs/chunkwise.md): two packed sequences of 20 and 17 tokens,
// split over the ranks by the torch.chunk rule; forward, then backward, with the ScanCompose
// policy. The reference is the same driver on a one-rank group.
int gdn_part(const ctxpar::Group& group) {
  namespace cw = ctxpar::chunkwise;
  using Heads = cw::head_view<real, mem>;  // [T, H]: log-gates g and write strengths beta
  const std::int64_t T = 37, H = 2, K = 8, V = 8;
  const std::vector<std::int64_t> cu_seqlens{0, 20, 37};  // global, the same on every rank
  const int me = group.rank();

  // The whole input, built on every rank (it is small); each rank hands the driver subviews of
  // its own rows. Keys must have unit norm and g < 0 (the decay is exp(g)).
  Tensor q = tensor("q", 11, 0, T, H, K), k = tensor("k", 12, 0, T, H, K);
  Tensor v = tensor("v", 13, 0, T, H, V), dout = tensor("dout", 16, 0, T, H, V);
  Heads g("g", T, H), beta("beta", T, H);
  {
    auto hk = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), k);
    auto hg = Kokkos::create_mirror_view(g);
    auto hb = Kokkos::create_mirror_view(beta);
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t h = 0; h < H; ++h) {
        double norm2 = 0;
        for (std::int64_t c = 0; c < K; ++c) norm2 += hk(i, h, c) * hk(i, h, c);
        for (std::int64_t c = 0; c < K; ++c) hk(i, h, c) /= std::sqrt(norm2);
        hg(i, h) = -0.1 * (1.0 + value(14, i * H + h));  // in (-0.2, 0]
        hb(i, h) = 0.5 * (1.0 + value(15, i * H + h));   // in [0, 1)
      }
    Kokkos::deep_copy(k, hk);
    Kokkos::deep_copy(g, hg);
    Kokkos::deep_copy(beta, hb);
  }
  // Chunks of 8 tokens so that every shard spans several chunks; scale 0 means K^(-1/2).
  const cw::GatedDeltaRuleBackend<real, mem> backend(cw::BackendOptions{8, 0.0});

  // Forward and backward over `grp`, with this rank's rows [b, e); returns o, dq, dk, dv.
  auto run = [&](const ctxpar::Group& grp, std::int64_t b, std::int64_t e) {
    const auto plan =
        cw::SequenceLayout::create(grp, ctxpar::Contiguous{}, cu_seqlens);  // collective
    const auto rows = std::make_pair(b, e);
    auto rows3 = [&](const Tensor& x) {
      return Tensor(Kokkos::subview(x, rows, Kokkos::ALL, Kokkos::ALL));
    };
    auto rows2 = [&](const Heads& x) { return Heads(Kokkos::subview(x, rows, Kokkos::ALL)); };
    const cw::GatedDeltaRuleInputs<real, mem> in{rows3(q), rows3(k), rows3(v), rows2(g),
                                                 rows2(beta)};
    const std::int64_t n = plan.local_length();  // == e - b
    Tensor o("o", n, H, V), dq("dq", n, H, K), dk("dk", n, H, K), dv("dv", n, H, V);
    Heads dg("dg", n, H), dbeta("dbeta", n, H);
    // The operator: built once per layer (collective, it agrees on the shape and options), then
    // called every step. The policy is a compile-time tag.
    auto cp = cw::make_cp_plan<cw::ScanCompose>(exec(), grp, backend, plan,
                                                cw::ChunkwiseShape{n, H, K, V});
    // The context keeps references to the inputs: do not overwrite them before the backward.
    cw::ChunkwiseContext<cw::GatedDeltaRuleBackend<real, mem>> ctx;
    cp.forward(in, o, ctx);
    cp.backward(ctx, rows3(dout), cw::GatedDeltaRuleGradients<real, mem>{dq, dk, dv, dg, dbeta});
    return std::array<Tensor, 4>{o, dq, dk, dv};
  };

  const ctxpar::BalancedChunks shard{T, group.size()};  // the plan's contiguous split
  const auto mine = run(group, shard.begin(me), shard.end(me));
  const ctxpar::Group self(MPI_COMM_SELF);  // a one-rank group: the single-rank reference
  const auto whole = run(self, 0, T);

  // Summaries cross ranks in fp32 whatever the activation type, so a distributed fp64 result
  // differs from the single-rank one by about fp32 rounding of the incoming states.
  const double tol = 1e-5;
  const char* names[4] = {"o", "dq", "dk", "dv"};
  std::vector<std::pair<const char*, double>> diffs;
  for (int i = 0; i < 4; ++i)
    diffs.emplace_back(names[i], rel_diff(mine[i], whole[i], shard.begin(me)));
  return report("gdn", me, diffs, {tol, tol, tol, tol});
}

// 3. Head-parallel transposes (docs/heads.md): the input projection of a Gated Delta Product
// layer, [T/P, C] sequence-sharded -> [T, C_j] head-sharded and back. UnevenHeads + Contiguous
// accept any head and token count (uneven token shards, key groups shared by several ranks).
int heads_part(const ctxpar::Group& group) {
  namespace ch = ctxpar::heads;
  using Plan = ch::TransposePlan<ctxpar::UnevenHeads, ctxpar::Contiguous, exec, real>;
  using Rows = Plan::view_type;  // [rows, channels], LayoutRight
  const std::int64_t T = 13;
  const ch::GdpShape shape{/*nheads*/ 4,      /*headdim*/ 2,
                           /*ngroups*/ 2,     /*d_state*/ 3,
                           /*householder*/ 2, /*conv_width*/ 4};
  const int me = group.rank();
  const Plan plan(exec(), group, shape.input_layout(), T);  // collective; allocates once
  const std::int64_t C = plan.channels(), Cj = plan.local_channels(), b = plan.row_begin(me);
  // For each channel this rank holds after the transpose, the P = 1 channel it comes from.
  const std::vector<std::int64_t> source = plan.layout().channel_map(plan.blocks(), me);

  auto x_at = [&](std::int64_t t, std::int64_t c) { return value(21, t * C + c); };   // global x
  auto dy_at = [&](std::int64_t t, std::int64_t c) { return value(22, t * C + c); };  // global dy
  Rows x("x", plan.local_rows(), C), y("y", T, Cj), back("back", plan.local_rows(), C);
  Rows dy("dy", T, Cj), dx("dx", plan.local_rows(), C);
  {
    auto hx = Kokkos::create_mirror_view(x);
    for (std::int64_t t = 0; t < plan.local_rows(); ++t)
      for (std::int64_t c = 0; c < C; ++c) hx(t, c) = x_at(b + t, c);
    Kokkos::deep_copy(x, hx);
    auto hdy = Kokkos::create_mirror_view(dy);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t c = 0; c < Cj; ++c) hdy(t, c) = dy_at(t, source[c]);
    Kokkos::deep_copy(dy, hdy);
  }
  plan.to_head_parallel(x, y);            // all T tokens, this rank's heads and groups
  plan.to_sequence_parallel(y, back);     // the inverse: back == x bit for bit
  plan.adjoint_to_head_parallel(dy, dx);  // the backward of to_head_parallel

  // A key group used by the heads of several ranks is sent to each of them, so its gradient is
  // the sum of their copies: count the holders of every channel.
  std::vector<int> holders(C, 0);
  for (int j = 0; j < group.size(); ++j)
    for (auto c : plan.layout().channel_map(plan.blocks(), j)) ++holders[c];

  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  auto hback = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), back);
  auto hdx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dx);
  double e_y = 0, e_back = 0, e_dx = 0;
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < Cj; ++c)
      e_y = std::fmax(e_y, std::fabs(hy(t, c) - x_at(t, source[c])));
  for (std::int64_t t = 0; t < plan.local_rows(); ++t)
    for (std::int64_t c = 0; c < C; ++c) {
      e_back = std::fmax(e_back, std::fabs(hback(t, c) - x_at(b + t, c)));
      e_dx = std::fmax(e_dx, std::fabs(hdx(t, c) - holders[c] * dy_at(b + t, c)));
    }
  // Data movement only: exact, except the adjoint's sums of up to P copies.
  return report("heads", me, {{"y", e_y}, {"back", e_back}, {"dx", e_dx}},
                {0.0, 0.0, 4 * group.size() * 1.2e-16});
}

int main(int argc, char* argv[]) {
  boost::mpi::environment env(argc, argv);  // MPI first, then Kokkos
  Kokkos::ScopeGuard kokkos(argc, argv);
  int failed = 0;
  {  // every ctxpar object and view is destroyed before Kokkos and MPI shut down
    const ctxpar::Group group(MPI_COMM_WORLD);  // duplicates the communicator
    failed += swa_part(group);
    failed += gdn_part(group);
    failed += heads_part(group);
  }
  return failed == 0 ? 0 : 1;
}
