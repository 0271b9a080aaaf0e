// The one partition plan every layer of the `ctxpar hybrid` stack shares, and the re-layout of
// rows between it and the sliding-window layer's streaming layout.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/comm/alltoall.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
#include "hybrid/host_math.hpp"
#include "hybrid/phase_clock.hpp"

namespace ctxpar::cli::hybrid {

/// Which tokens each rank holds: contiguous shards (`torch.chunk` rule) or zigzag (`2P` chunks,
/// rank `r` holds chunks `r` and `2P-1-r`), over packed documents `cu_seqlens`.
struct TokenPlan {
  std::int64_t length = 0;               ///< tokens `L`
  int parts = 1;                         ///< ranks `P`
  bool zigzag = false;                   ///< zigzag instead of contiguous
  std::vector<std::int64_t> cu_seqlens;  ///< document boundaries `[0, …, L]`

  /// Natural indices of rank `r`'s rows, in local order.
  std::vector<std::int64_t> tokens_of(int r) const {
    std::vector<std::int64_t> out;
    if (!zigzag) {
      const BalancedChunks c{length, parts};
      for (std::int64_t i = c.begin(r); i < c.end(r); ++i) out.push_back(i);
      return out;
    }
    const BalancedChunks c{length, 2 * parts};
    for (int n : {r, 2 * parts - 1 - r})
      for (std::int64_t i = c.begin(n); i < c.end(n); ++i) out.push_back(i);
    return out;
  }

  /// Document id of every token (0 when there is one document).
  std::vector<std::int32_t> document_ids() const {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(length), 0);
    for (std::size_t d = 0; d + 1 < cu_seqlens.size(); ++d)
      for (std::int64_t i = cu_seqlens[d]; i < cu_seqlens[d + 1]; ++i)
        ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(d);
    return ids;
  }
};

/// Moves rows between two token layouts (each a list of natural indices per rank, the same on
/// every rank) with one all-to-all. Used to hand the sliding-window layer its streaming shards.
class Relayout {
 public:
  Relayout() = default;
  /// `from[r]`, `to[r]`: natural indices of rank `r`'s rows before and after, in local order.
  Relayout(const Group& group, const std::vector<std::vector<std::int64_t>>& from,
           const std::vector<std::vector<std::int64_t>>& to, std::int64_t length)
      : group_(&group) {
    const int p = group.size(), me = group.rank();
    std::vector<int> from_owner(static_cast<std::size_t>(length), -1);
    std::vector<std::int64_t> from_local(static_cast<std::size_t>(length), -1);
    for (int r = 0; r < p; ++r)
      for (std::size_t j = 0; j < from[r].size(); ++j) {
        from_owner[static_cast<std::size_t>(from[r][j])] = r;
        from_local[static_cast<std::size_t>(from[r][j])] = static_cast<std::int64_t>(j);
      }
    send_counts_.assign(p, 0);
    recv_counts_.assign(p, 0);
    // Send to rank q: the rows q will hold that live here, in q's order.
    for (int q = 0; q < p; ++q)
      for (std::int64_t i : to[q])
        if (from_owner[static_cast<std::size_t>(i)] == me) {
          send_rows_.push_back(from_local[static_cast<std::size_t>(i)]);
          ++send_counts_[q];
        }
    // Receive from rank s: my rows that live on s, in my order.
    for (int s = 0; s < p; ++s)
      for (std::size_t j = 0; j < to[me].size(); ++j)
        if (from_owner[static_cast<std::size_t>(to[me][j])] == s) {
          recv_rows_.push_back(static_cast<std::int64_t>(j));
          ++recv_counts_[s];
        }
    from_rows_ = static_cast<std::int64_t>(from[me].size());
    to_rows_ = static_cast<std::int64_t>(to[me].size());
  }

  /// Rows of `a` (in the `from` layout) re-laid out to the `to` layout. Collective.
  Matrix forward(const Matrix& a) const {
    return move(a, send_rows_, send_counts_, recv_rows_, recv_counts_, to_rows_);
  }
  /// The inverse move (`to` layout back to `from`). Collective.
  Matrix backward(const Matrix& a) const {
    return move(a, recv_rows_, recv_counts_, send_rows_, send_counts_, from_rows_);
  }

 private:
  using HostVector = Kokkos::View<double*, Kokkos::HostSpace>;

  Matrix move(const Matrix& a, const std::vector<std::int64_t>& out_rows,
              const std::vector<int>& out_counts, const std::vector<std::int64_t>& in_rows,
              const std::vector<int>& in_counts, std::int64_t rows) const {
    const std::int64_t w = a.cols;
    const PhaseScope timed(PhaseClock::relayout);
    HostVector send("ctxpar::hybrid::relayout_send", out_rows.size() * static_cast<std::size_t>(w));
    HostVector recv("ctxpar::hybrid::relayout_recv", in_rows.size() * static_cast<std::size_t>(w));
    for (std::size_t k = 0; k < out_rows.size(); ++k)
      for (std::int64_t j = 0; j < w; ++j) send(k * w + j) = a(out_rows[k], j);
    std::vector<int> sc(out_counts), rc(in_counts);
    for (auto& c : sc) c *= static_cast<int>(w);
    for (auto& c : rc) c *= static_cast<int>(w);
    alltoallv(Kokkos::DefaultHostExecutionSpace(), *group_, send, sc, recv, rc);
    Matrix out(rows, w);
    for (std::size_t k = 0; k < in_rows.size(); ++k)
      for (std::int64_t j = 0; j < w; ++j) out(in_rows[k], j) = recv(k * w + j);
    return out;
  }

  const Group* group_ = nullptr;
  std::vector<std::int64_t> send_rows_, recv_rows_;
  std::vector<int> send_counts_, recv_counts_;
  std::int64_t from_rows_ = 0, to_rows_ = 0;
};

}  // namespace ctxpar::cli::hybrid
