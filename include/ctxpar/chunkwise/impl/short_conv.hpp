/// \file
/// The implementation of `chunkwise::ShortConvPlan` (chunkwise/short_conv.hpp): the fragments'
/// halo links per layout, the halo exchange, the forward and gradient kernels and the layout
/// checks.
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
#include "ctxpar/core/impl/causal_conv.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/partition/zigzag.hpp"

namespace ctxpar::chunkwise {

namespace impl {

template <class Scalar, class MemorySpace>
struct ConvViews {
  using rows = Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>;
  using ids = Kokkos::View<const std::int32_t*, MemorySpace>;
};

// The halo exchange's buffers, owned by `ShortConvPlan` and sized by its constructor for the
// largest views a call carves from them, so no call allocates.
template <class Scalar, class MemorySpace>
struct ConvWorkspace {
  using rows_view = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;
  using ids_view = Kokkos::View<std::int32_t*, MemorySpace>;
  GrowingBuffer<MemorySpace> halo{"ctxpar::chunkwise::conv::halo"},
      send{"ctxpar::chunkwise::conv::send"}, recv{"ctxpar::chunkwise::conv::recv"},
      dhalo{"ctxpar::chunkwise::conv::dhalo"}, back{"ctxpar::chunkwise::conv::halo_grad"},
      halo_send{"ctxpar::chunkwise::conv::halo_send"},
      halo_ids{"ctxpar::chunkwise::conv::halo_ids"}, send_ids{"ctxpar::chunkwise::conv::send_ids"},
      recv_ids{"ctxpar::chunkwise::conv::recv_ids"};

  // Bytes held now.
  std::size_t bytes() const {
    std::size_t b = 0;
    for (const auto* buffer :
         {&halo, &send, &recv, &dhalo, &back, &halo_send, &halo_ids, &send_ids, &recv_ids})
      b += buffer->capacity_bytes();
    return b;
  }
};

// Where a fragment's halo comes from and where its tail goes: another rank, nobody (sequence
// start / end), or the rank's own other fragment (zigzag, rank P-1).
struct ConvLinks {
  int fragments = 1;            // 1 (contiguous) or 2 (zigzag)
  std::int64_t split = 0;       // first local row of fragment 1 (= T when there is none)
  int halo_from[2] = {-1, -1};  // rank sending fragment f's halo (no_rank: zeros)
  int tail_to[2] = {-1, -1};    // rank receiving fragment f's tail (no_rank: none)
  bool local_handover = false;  // fragment 0's tail is fragment 1's halo (zigzag, rank P-1)
};

inline ConvLinks conv_links(Contiguous, const Group& group, std::int64_t tokens) {
  ConvLinks l;
  l.fragments = 1;
  l.split = tokens;
  l.halo_from[0] = group.rank() > 0 ? group.rank() - 1 : no_rank;
  l.tail_to[0] = group.rank() + 1 < group.size() ? group.rank() + 1 : no_rank;
  return l;
}

inline ConvLinks conv_links(Zigzag, const Group& group, std::int64_t tokens) {
  const int r = group.rank(), p = group.size();
  ConvLinks l;
  l.fragments = 2;
  l.split = tokens / 2;
  l.halo_from[0] = r > 0 ? r - 1 : no_rank;      // chunk r-1
  l.tail_to[0] = r + 1 < p ? r + 1 : no_rank;    // chunk r+1 (rank P-1: its own chunk P)
  l.halo_from[1] = r + 1 < p ? r + 1 : no_rank;  // chunk 2P-2-r
  l.tail_to[1] = r > 0 ? r - 1 : no_rank;        // chunk 2P-r
  l.local_handover = r + 1 == p;
  return l;
}

// Value and id of a tap. Fragment f holds local rows [begin(f), end(f)); its halo is rows
// [f·(w-1), (f+1)·(w-1)) of `halo`. Tap positions u are fragment-relative: u >= 0 is local row
// begin(f) + u, u in [-(w-1), 0) is halo row f·(w-1) + (w-1) + u.
template <class Scalar, class MemorySpace>
struct ConvSource {
  typename ConvViews<Scalar, MemorySpace>::rows x, halo;
  typename ConvViews<Scalar, MemorySpace>::ids ids, halo_ids;
  std::int64_t width, split, tokens;
  bool masked;
  KOKKOS_INLINE_FUNCTION int fragment(std::int64_t t) const { return t >= split ? 1 : 0; }
  KOKKOS_INLINE_FUNCTION std::int64_t begin(int f) const { return f == 0 ? 0 : split; }
  KOKKOS_INLINE_FUNCTION std::int64_t end(int f) const { return f == 0 ? split : tokens; }
  KOKKOS_INLINE_FUNCTION std::int64_t halo_row(int f, std::int64_t u) const {
    return f * (width - 1) + (width - 1) + u;
  }
  // Whether the tap at u may reach the fragment's token ut (same sequence, and exists).
  KOKKOS_INLINE_FUNCTION bool reaches(int f, std::int64_t u, std::int64_t ut) const {
    if (u + width - 1 < 0) return false;
    if (!masked) return true;
    const std::int32_t id_src = u >= 0 ? ids(begin(f) + u) : halo_ids(halo_row(f, u));
    return id_src == ids(begin(f) + ut);
  }
  KOKKOS_INLINE_FUNCTION Scalar value(int f, std::int64_t u, std::int64_t c) const {
    return u >= 0 ? x(begin(f) + u, c) : halo(halo_row(f, u), c);
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
    const int f = src.fragment(t);
    const std::int64_t ut = t - src.begin(f);
    // Tap j reads fragment position ut − (w − 1) + j: a halo row (the carried prefix) below 0.
    y(t, c) = ctxpar::impl::causal_window_dot(
        bias.data() ? bias(c) : Scalar(0), std::int64_t(0), w,
        [&](std::int64_t j) { return weight(c, j); },
        [&](std::int64_t j) { return src.value(f, ut - (w - 1) + j, c); },
        [&](std::int64_t j) { return src.reaches(f, ut - (w - 1) + j, ut); });
  }
};

// dx of a local row or of a halo row: Σ_j weight[c, j]·dy[u + w-1-j] within the fragment. The
// index space is every fragment's halo followed by its rows ("extended" rows).
template <class Scalar, class MemorySpace>
struct ConvInputGradKernel {
  ConvSource<Scalar, MemorySpace> src;
  typename ConvViews<Scalar, MemorySpace>::rows weight, dy;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> dx, dhalo;
  std::int64_t channels;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t w = src.width, e = i / channels, c = i % channels;
    const int f = e >= src.split + (w - 1) ? 1 : 0;
    const std::int64_t u = e - src.begin(f) - f * (w - 1) - (w - 1);
    const std::int64_t n = src.end(f) - src.begin(f);
    // The transposed window: tap j of row u meets output ut = u + (w − 1) − j of the fragment.
    const Scalar acc = ctxpar::impl::causal_window_dot(
        Scalar(0), std::int64_t(0), w, [&](std::int64_t j) { return weight(c, j); },
        [&](std::int64_t j) { return dy(src.begin(f) + u + (w - 1) - j, c); },
        [&](std::int64_t j) {
          const std::int64_t ut = u + (w - 1) - j;
          return ut >= 0 && ut < n && src.reaches(f, u, ut);
        });
    if (u >= 0) {
      dx(src.begin(f) + u, c) = acc;
    } else {
      dhalo(src.halo_row(f, u), c) = acc;
    }
  }
};

template <class Scalar, class MemorySpace>
struct ConvWeightGradKernel {
  ConvSource<Scalar, MemorySpace> src;
  typename ConvViews<Scalar, MemorySpace>::rows dy;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> dweight;
  Kokkos::View<Scalar*, MemorySpace> dbias;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t w = src.width, c = i / w, j = i % w;
    Scalar acc = 0, bacc = 0;
    for (std::int64_t t = 0; t < src.tokens; ++t) {
      const int f = src.fragment(t);
      const std::int64_t ut = t - src.begin(f), u = ut - (w - 1) + j;
      if (src.reaches(f, u, ut)) acc += dy(t, c) * src.value(f, u, c);
      bacc += dy(t, c);
    }
    dweight(c, j) = acc;
    if (j == 0 && dbias.data()) dbias(c) = bacc;
  }
};

template <class Scalar, class MemorySpace>
struct AddRowsKernel {  // dx[offset + r, c] += back[r, c]
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> dx;
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace> back;
  std::int64_t channels, offset;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    dx(offset + i / channels, i % channels) += back(i / channels, i % channels);
  }
};

template <class ExecutionSpace>
auto conv_range(const ExecutionSpace& space, std::int64_t n) {
  return Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n);
}

inline void conv_layout_checks(Contiguous, const Group& group, std::int64_t tokens, std::int64_t w,
                               Preconditions& chk) {
  const bool sends = group.rank() + 1 < group.size();
  chk.require(!sends || tokens >= w - 1,
              "every shard but the last must hold at least w - 1 tokens (the next rank's halo)",
              ">= " + ctxpar::impl::to_text(w - 1) + " tokens", tokens);
}

inline void conv_layout_checks(Zigzag, const Group& group, std::int64_t tokens, std::int64_t w,
                               Preconditions& chk) {
  chk.require(tokens % 2 == 0, "a zigzag shard holds two chunks of equal length (an even count)",
              "an even number of tokens", tokens);
  chk.require_same("the zigzag shard length 2C", tokens);
  // Chunk r always feeds chunk r+1 (on rank r+1, or rank P-1's own second chunk); chunk 2P-1-r
  // feeds chunk 2P-r unless it is the last chunk (rank 0).
  chk.require(tokens / 2 >= w - 1 || w == 1,
              "every zigzag chunk that feeds a successor must hold at least w - 1 tokens (the "
              "successor's halo)",
              ">= " + ctxpar::impl::to_text(w - 1) + " tokens per chunk",
              ctxpar::impl::to_text(tokens / 2) + " (shard of " + ctxpar::impl::to_text(tokens) +
                  " on " + ctxpar::impl::to_text(group.size()) + " ranks)");
}

// The forward halo exchange of x (and, `with_ids`, of the ids) into `ws`, for the shape the plan
// agreed on. Whether ids are given comes from that shape, not from `ids.data()`: an empty shard's
// ids may have no storage, yet it takes part in the ids' messages like every rank.
template <class ExecutionSpace, class Scalar, class MemorySpace>
ConvSource<Scalar, MemorySpace> conv_halo(
    const ExecutionSpace& space, const Group& group, const ConvLinks& links,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& x, std::int64_t w,
    const Kokkos::View<const std::int32_t*, MemorySpace>& ids, bool with_ids,
    ConvWorkspace<Scalar, MemorySpace>& ws) {
  const std::int64_t tokens = x.extent(0), channels = x.extent(1);
  const std::int64_t h = w - 1;
  using workspace = ConvWorkspace<Scalar, MemorySpace>;
  const auto halo =
      ctxpar::carve<typename workspace::rows_view>(ws.halo, links.fragments * h, channels);
  const auto halo_ids =
      with_ids ? ctxpar::carve<typename workspace::ids_view>(ws.halo_ids, links.fragments * h)
               : typename workspace::ids_view();
  Kokkos::deep_copy(space, halo, Scalar(0));             // zeros at the sequence start (no sender)
  if (with_ids) Kokkos::deep_copy(space, halo_ids, -1);  // zero halo: never the same sequence
  for (int f = 0; f < links.fragments; ++f) {
    // Fragment f's tail (at most w-1 rows; only a shard that sends nothing may be shorter).
    const std::int64_t fb = f == 0 ? 0 : links.split, fe = f == 0 ? links.split : tokens;
    const std::int64_t first = fe - fb >= h ? fe - h : fb;
    const auto halo_f = Kokkos::subview(halo, std::make_pair(f * h, (f + 1) * h), Kokkos::ALL);
    const auto halo_ids_f = Kokkos::subview(halo_ids, std::make_pair(f * h, (f + 1) * h));
    const auto send = ctxpar::carve<typename workspace::rows_view>(ws.send, fe - first, channels);
    if (fe > first)
      Kokkos::deep_copy(space, send, Kokkos::subview(x, std::make_pair(first, fe), Kokkos::ALL));
    const auto recv = ctxpar::carve<typename workspace::rows_view>(ws.recv, h, channels);
    sendrecv(space, group, send, links.tail_to[f], recv, links.halo_from[f], 41 + 2 * f);
    if (links.halo_from[f] != no_rank) Kokkos::deep_copy(space, halo_f, recv);
    if (with_ids) {
      const auto send_ids = ctxpar::carve<typename workspace::ids_view>(ws.send_ids, fe - first);
      const auto recv_ids = ctxpar::carve<typename workspace::ids_view>(ws.recv_ids, h);
      if (fe > first)
        Kokkos::deep_copy(space, send_ids, Kokkos::subview(ids, std::make_pair(first, fe)));
      sendrecv(space, group, send_ids, links.tail_to[f], recv_ids, links.halo_from[f], 42 + 2 * f);
      if (links.halo_from[f] != no_rank) Kokkos::deep_copy(space, halo_ids_f, recv_ids);
    }
  }
  if (links.local_handover && h > 0) {  // rank P-1 under zigzag: chunk P-1 precedes chunk P
    Kokkos::deep_copy(
        space, Kokkos::subview(halo, std::make_pair(h, 2 * h), Kokkos::ALL),
        Kokkos::subview(x, std::make_pair(links.split - h, links.split), Kokkos::ALL));
    if (with_ids)
      Kokkos::deep_copy(space, Kokkos::subview(halo_ids, std::make_pair(h, 2 * h)),
                        Kokkos::subview(ids, std::make_pair(links.split - h, links.split)));
  }
  ConvSource<Scalar, MemorySpace> s;
  s.x = x;
  s.halo = halo;
  s.ids = ids;
  s.halo_ids = halo_ids;
  s.width = w;
  s.split = links.split;
  s.tokens = tokens;
  s.masked = with_ids;
  return s;
}

template <class ExecutionSpace, class Scalar, class MemorySpace>
void conv_forward(const ExecutionSpace& space, const Group& group, const ConvLinks& links,
                  const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& x,
                  const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& weight,
                  const Kokkos::View<const Scalar*, MemorySpace>& bias,
                  const Kokkos::View<const std::int32_t*, MemorySpace>& seq_ids, bool with_ids,
                  const Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>& y,
                  ConvWorkspace<Scalar, MemorySpace>& ws) {
  const auto src = conv_halo(space, group, links, x, static_cast<std::int64_t>(weight.extent(1)),
                             seq_ids, with_ids, ws);
  const std::int64_t channels = x.extent(1);
  Kokkos::parallel_for("ctxpar::chunkwise::conv::forward",
                       conv_range(space, x.extent(0) * channels),
                       ConvForwardKernel<Scalar, MemorySpace>{src, weight, bias, y, channels});
}

template <class ExecutionSpace, class Scalar, class MemorySpace>
void conv_backward(const ExecutionSpace& space, const Group& group, const ConvLinks& links,
                   const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& x,
                   const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& weight,
                   const Kokkos::View<const std::int32_t*, MemorySpace>& seq_ids, bool with_ids,
                   const Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>& dy,
                   const Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>& dx,
                   const Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>& dweight,
                   const Kokkos::View<Scalar*, MemorySpace>& dbias,
                   ConvWorkspace<Scalar, MemorySpace>& ws) {
  const std::int64_t tokens = x.extent(0), channels = x.extent(1), w = weight.extent(1);
  const auto src = conv_halo(space, group, links, x, w, seq_ids, with_ids, ws);
  const std::int64_t h = w - 1;
  using workspace = ConvWorkspace<Scalar, MemorySpace>;
  const auto dhalo =
      ctxpar::carve<typename workspace::rows_view>(ws.dhalo, links.fragments * h, channels);
  Kokkos::deep_copy(space, dhalo, Scalar(0));
  Kokkos::parallel_for(
      "ctxpar::chunkwise::conv::input_grad",
      conv_range(space, (tokens + links.fragments * h) * channels),
      ConvInputGradKernel<Scalar, MemorySpace>{src, weight, dy, dx, dhalo, channels});
  Kokkos::parallel_for("ctxpar::chunkwise::conv::weight_grad", conv_range(space, channels * w),
                       ConvWeightGradKernel<Scalar, MemorySpace>{src, dy, dweight, dbias});
  // Each halo's gradient goes back to the fragment whose tail it was, and is added there.
  for (int f = 0; f < links.fragments; ++f) {
    const std::int64_t fb = f == 0 ? 0 : links.split, fe = f == 0 ? links.split : tokens;
    const std::int64_t back_rows = links.tail_to[f] != no_rank ? (fe - fb < h ? fe - fb : h) : 0;
    const auto back = ctxpar::carve<typename workspace::rows_view>(ws.back, back_rows, channels);
    const std::int64_t send_rows = links.halo_from[f] != no_rank ? h : 0;
    const auto send =
        ctxpar::carve<typename workspace::rows_view>(ws.halo_send, send_rows, channels);
    if (send_rows > 0)
      Kokkos::deep_copy(
          space, send,
          Kokkos::subview(dhalo, std::make_pair(f * h, f * h + send_rows), Kokkos::ALL));
    sendrecv(space, group, send, links.halo_from[f], back, links.tail_to[f], 45 + f);
    if (back_rows > 0) {
      Kokkos::parallel_for("ctxpar::chunkwise::conv::add_halo_grad",
                           conv_range(space, back_rows * channels),
                           AddRowsKernel<Scalar, MemorySpace>{dx, back, channels, fe - back_rows});
    }
  }
  if (links.local_handover && h > 0) {
    Kokkos::parallel_for("ctxpar::chunkwise::conv::add_halo_grad", conv_range(space, h * channels),
                         AddRowsKernel<Scalar, MemorySpace>{
                             dx, Kokkos::subview(dhalo, std::make_pair(h, 2 * h), Kokkos::ALL),
                             channels, links.split - h});
  }
  allreduce_sum(space, group, dweight, unchecked);
  if (dbias.data()) allreduce_sum(space, group, dbias, unchecked);
}

}  // namespace impl

}  // namespace ctxpar::chunkwise
