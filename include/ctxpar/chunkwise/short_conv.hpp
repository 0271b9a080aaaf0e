/// \file
/// Depthwise causal short convolution over sequence shards (the width-`w` conv GDN/GDP layers run
/// before the recurrence), with the halo exchange context parallelism needs:
///
///   `y_t[c] = bias[c] + Σ_{j<w} weight[c, j] · x_{t-(w-1)+j}[c]`  (`weight[c, w-1]` hits token t)
///
/// Rank `r` needs the last `w-1` input rows of rank `r-1`: a ring exchange (`sendrecv`, rank `r`
/// sends to `r+1`), zeros on rank 0. With per-token sequence ids (packed input) every tap whose
/// token belongs to another sequence than token `t` is masked, inside the shard and in the halo.
/// The backward sends the halo gradient back to its owner and sums the weight and bias gradients
/// over the ranks (`allreduce_sum`).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/comm/reduce.hpp"
#include "ctxpar/comm/sendrecv.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar::chunkwise {

namespace impl {

template <class Scalar, class MemorySpace>
struct ConvViews {
  using rows = Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>;
  using ids = Kokkos::View<const std::int32_t*, MemorySpace>;
};

// Value and id of tap source `src` (local index, negative = halo row w-1+src).
template <class Scalar, class MemorySpace>
struct ConvSource {
  typename ConvViews<Scalar, MemorySpace>::rows x, halo;
  typename ConvViews<Scalar, MemorySpace>::ids ids, halo_ids;
  std::int64_t width;
  bool masked;
  // Whether the tap from `src` may reach token t (same sequence, and exists).
  KOKKOS_INLINE_FUNCTION bool reaches(std::int64_t src, std::int64_t t) const {
    if (src + width - 1 < 0) return false;
    if (!masked) return true;
    const std::int32_t id_src = src >= 0 ? ids(src) : halo_ids(width - 1 + src);
    return id_src == ids(t);
  }
  KOKKOS_INLINE_FUNCTION Scalar value(std::int64_t src, std::int64_t c) const {
    return src >= 0 ? x(src, c) : halo(width - 1 + src, c);
  }
};

template <class Scalar, class MemorySpace>
struct ConvForwardKernel {
  ConvSource<Scalar, MemorySpace> src;
  typename ConvViews<Scalar, MemorySpace>::rows weight;
  Kokkos::View<const Scalar*, MemorySpace> bias;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> y;
  std::int64_t channels;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t t = i / channels, c = i % channels, w = src.width;
    Scalar acc = bias.data() ? bias(c) : Scalar(0);
    for (std::int64_t j = 0; j < w; ++j) {
      const std::int64_t s = t - (w - 1) + j;
      if (src.reaches(s, t)) acc += weight(c, j) * src.value(s, c);
    }
    y(t, c) = acc;
  }
};

// dx of local row s (s >= 0) or of halo row s (s < 0): Σ_j weight[c, j]·dy[s + w-1-j].
template <class Scalar, class MemorySpace>
struct ConvInputGradKernel {
  ConvSource<Scalar, MemorySpace> src;
  typename ConvViews<Scalar, MemorySpace>::rows weight, dy;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> dx, dhalo;
  std::int64_t channels, tokens;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t w = src.width;
    const std::int64_t s = i / channels - (w - 1), c = i % channels;
    Scalar acc = 0;
    for (std::int64_t j = 0; j < w; ++j) {
      const std::int64_t t = s + (w - 1) - j;
      if (t >= 0 && t < tokens && src.reaches(s, t)) acc += weight(c, j) * dy(t, c);
    }
    if (s >= 0) {
      dx(s, c) = acc;
    } else {
      dhalo(w - 1 + s, c) = acc;
    }
  }
};

template <class Scalar, class MemorySpace>
struct ConvWeightGradKernel {
  ConvSource<Scalar, MemorySpace> src;
  typename ConvViews<Scalar, MemorySpace>::rows dy;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> dweight;
  Kokkos::View<Scalar*, MemorySpace> dbias;
  std::int64_t tokens;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t w = src.width, c = i / w, j = i % w;
    Scalar acc = 0, bacc = 0;
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t s = t - (w - 1) + j;
      if (src.reaches(s, t)) acc += dy(t, c) * src.value(s, c);
      bacc += dy(t, c);
    }
    dweight(c, j) = acc;
    if (j == 0 && dbias.data()) dbias(c) = bacc;
  }
};

template <class Scalar, class MemorySpace>
struct AddRowsKernel {  // dx[T-(w-1)+r, c] += back[r, c]
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> dx, back;
  std::int64_t channels, offset;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    dx(offset + i / channels, i % channels) += back(i / channels, i % channels);
  }
};

template <class ExecutionSpace>
auto conv_range(const ExecutionSpace& space, std::int64_t n) {
  return Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n);
}

// Shared checks and the forward halo exchange of x (and ids).
template <class ExecutionSpace, class Scalar, class MemorySpace>
ConvSource<Scalar, MemorySpace> conv_halo(
    const ExecutionSpace& space, const Group& group, const std::string& op,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& x,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& weight,
    const Kokkos::View<const std::int32_t*, MemorySpace>& ids, Preconditions& chk) {
  const std::int64_t tokens = x.extent(0), channels = x.extent(1), w = weight.extent(1);
  chk.require(w >= 1, "the conv width w must be positive", ">= 1", w);
  chk.require(static_cast<std::int64_t>(weight.extent(0)) == channels,
              "weight must be [C, w] with the C of x", channels, weight.extent(0));
  chk.require(ids.data() == nullptr || static_cast<std::int64_t>(ids.extent(0)) == tokens,
              "sequence ids must hold one id per local token", tokens, ids.extent(0));
  const bool sends = group.rank() + 1 < group.size();
  chk.require(!sends || tokens >= w - 1,
              "every shard but the last must hold at least w - 1 tokens (the next rank's halo)",
              ">= " + ctxpar::impl::to_text(w - 1) + " tokens", tokens);
  chk.require_same("the channel count C", channels);
  chk.require_same("the conv width w", w);
  chk.require_same("whether sequence ids are given", ids.data() ? 1 : 0);
  chk.agree();

  const std::int64_t halo_rows = w - 1;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> halo("ctxpar::chunkwise::conv::halo",
                                                                halo_rows, channels);
  Kokkos::View<std::int32_t*, MemorySpace> halo_ids("ctxpar::chunkwise::conv::halo_ids", halo_rows);
  const int next = sends ? group.rank() + 1 : no_rank;
  const int prev = group.rank() > 0 ? group.rank() - 1 : no_rank;
  const std::int64_t first = tokens >= halo_rows ? tokens - halo_rows : 0;
  auto tail = Kokkos::subview(x, std::make_pair(first, tokens), Kokkos::ALL);
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> send("ctxpar::chunkwise::conv::send",
                                                                tokens - first, channels);
  Kokkos::deep_copy(space, send, tail);
  sendrecv(space, group, send, next, halo, prev, 41);
  if (ids.data()) {
    Kokkos::View<std::int32_t*, MemorySpace> send_ids("ctxpar::chunkwise::conv::send_ids",
                                                      tokens - first);
    Kokkos::deep_copy(space, send_ids, Kokkos::subview(ids, std::make_pair(first, tokens)));
    sendrecv(space, group, send_ids, next, halo_ids, prev, 42);
  }
  if (prev == no_rank)
    Kokkos::deep_copy(space, halo_ids, -1);  // rank 0: zero halo, never same sequence
  ConvSource<Scalar, MemorySpace> s;
  s.x = x;
  s.halo = halo;
  s.ids = ids;
  s.halo_ids = halo_ids;
  s.width = w;
  s.masked = ids.data() != nullptr;
  (void)op;
  return s;
}

}  // namespace impl

/// Forward of the depthwise causal conv over a sequence shard. `x [T, C]` (the rank's tokens in
/// order; e.g. `[T, H·D]` flattened), `weight [C, w]`, `bias [C]` (empty view: no bias),
/// `seq_ids [T]` int32 (empty view: one sequence), `y [T, C]`. Collective (one `sendrecv`, two
/// with ids); bad input on any rank makes every rank throw the same `Error`.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void short_conv_forward(
    const ExecutionSpace& space, const Group& group,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& x,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& weight,
    const Kokkos::View<const Scalar*, MemorySpace>& bias,
    const Kokkos::View<const std::int32_t*, MemorySpace>& seq_ids,
    const Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>& y) {
  using x_view = Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::chunkwise::short_conv_forward", ExecutionSpace, x_view);
  compat::ScopedRegion region("ctxpar::chunkwise::short_conv_forward");
  const std::string op = "ctxpar::chunkwise::short_conv_forward";
  Preconditions chk(group, op);
  chk.require(y.extent(0) == x.extent(0) && y.extent(1) == x.extent(1),
              "y must have the shape of x [T, C]",
              ctxpar::impl::to_text(x.extent(0)) + " x " + ctxpar::impl::to_text(x.extent(1)),
              ctxpar::impl::to_text(y.extent(0)) + " x " + ctxpar::impl::to_text(y.extent(1)));
  chk.require(bias.data() == nullptr || bias.extent(0) == x.extent(1), "bias must be [C]",
              x.extent(1), bias.extent(0));
  const auto src = impl::conv_halo(space, group, op, x, weight, seq_ids, chk);
  const std::int64_t channels = x.extent(1);
  Kokkos::parallel_for(
      "ctxpar::chunkwise::conv::forward", impl::conv_range(space, x.extent(0) * channels),
      impl::ConvForwardKernel<Scalar, MemorySpace>{src, weight, bias, y, channels});
}

/// Backward of `short_conv_forward`: `dx [T, C]` (including the gradient that other ranks' halos
/// send back), `dweight [C, w]` and `dbias [C]` (optional) summed over all ranks. Collective.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void short_conv_backward(
    const ExecutionSpace& space, const Group& group,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& x,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& weight,
    const Kokkos::View<const std::int32_t*, MemorySpace>& seq_ids,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& dy,
    const Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>& dx,
    const Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>& dweight,
    const Kokkos::View<Scalar*, MemorySpace>& dbias) {
  using x_view = Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::chunkwise::short_conv_backward", ExecutionSpace, x_view);
  compat::ScopedRegion region("ctxpar::chunkwise::short_conv_backward");
  const std::string op = "ctxpar::chunkwise::short_conv_backward";
  Preconditions chk(group, op);
  chk.require(dy.extent(0) == x.extent(0) && dy.extent(1) == x.extent(1) &&
                  dx.extent(0) == x.extent(0) && dx.extent(1) == x.extent(1),
              "dy and dx must have the shape of x [T, C]", ctxpar::impl::to_text(x.extent(0)),
              dy.extent(0));
  chk.require(dweight.extent(0) == weight.extent(0) && dweight.extent(1) == weight.extent(1),
              "dweight must have the shape of weight", weight.extent(0), dweight.extent(0));
  const auto src = impl::conv_halo(space, group, op, x, weight, seq_ids, chk);
  const std::int64_t tokens = x.extent(0), channels = x.extent(1), w = weight.extent(1);
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> dhalo("ctxpar::chunkwise::conv::dhalo",
                                                                 w - 1, channels);
  Kokkos::parallel_for(
      "ctxpar::chunkwise::conv::input_grad", impl::conv_range(space, (tokens + w - 1) * channels),
      impl::ConvInputGradKernel<Scalar, MemorySpace>{src, weight, dy, dx, dhalo, channels, tokens});
  Kokkos::parallel_for(
      "ctxpar::chunkwise::conv::weight_grad", impl::conv_range(space, channels * w),
      impl::ConvWeightGradKernel<Scalar, MemorySpace>{src, dy, dweight, dbias, tokens});
  // The halo came from rank r-1's last rows: their gradient goes back there.
  const int prev = group.rank() > 0 ? group.rank() - 1 : no_rank;
  const int next = group.rank() + 1 < group.size() ? group.rank() + 1 : no_rank;
  const std::int64_t back_rows = next != no_rank ? (tokens < w - 1 ? tokens : w - 1) : 0;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> back(
      "ctxpar::chunkwise::conv::halo_grad", back_rows, channels);
  auto halo_part = Kokkos::subview(
      dhalo, std::make_pair(w - 1 - (prev != no_rank ? w - 1 : 0), w - 1), Kokkos::ALL);
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> send(
      "ctxpar::chunkwise::conv::halo_send", halo_part.extent(0), channels);
  Kokkos::deep_copy(space, send, halo_part);
  sendrecv(space, group, send, prev, back, next, 43);
  if (back_rows > 0) {
    Kokkos::parallel_for(
        "ctxpar::chunkwise::conv::add_halo_grad", impl::conv_range(space, back_rows * channels),
        impl::AddRowsKernel<Scalar, MemorySpace>{dx, back, channels, tokens - back_rows});
  }
  allreduce_sum(space, group, dweight);
  if (dbias.data()) allreduce_sum(space, group, dbias);
}

}  // namespace ctxpar::chunkwise
