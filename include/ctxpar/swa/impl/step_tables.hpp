/// \file
/// The exchange tables of one step layout, kept in the caller's `DistributedState` so a step's
/// backward moves gradients by the tables its forward used. Each exchange owns its own tables:
/// the next-cache re-shard (every policy), the whole-axis assembly (`WholeAxisChunks` only) and
/// the policy's exchange (the all-gather or the halo). A state may serve plans of different
/// policies in turn; a forward rebuilds the tables whenever the plan or the layout changes.
#pragma once

#include <cstdint>
#include <optional>
#include <variant>

#include "ctxpar/swa/impl/gather_exchange.hpp"
#include "ctxpar/swa/impl/halo_exchange.hpp"
#include "ctxpar/swa/impl/layout.hpp"
#include "ctxpar/swa/impl/next_cache_reshard.hpp"
#include "ctxpar/swa/impl/whole_axis_assembly.hpp"
#include "ctxpar/swa/impl/window_range.hpp"

namespace ctxpar::swa::impl {

/// The tables of one step layout (cache and chunk lengths, window, rank count) on one rank.
template <class MemorySpace>
struct StepTables {
  AxisLayout layout;
  WindowRange range;
  bool ready = false;
  /// The next cache's re-shard from the caller's per-segment shards.
  NextCacheReshard<MemorySpace> reshard;
  /// `WholeAxisChunks`: the move onto the whole-axis owners (fused with the re-shard).
  std::optional<WholeAxisAssembly<MemorySpace>> assembly;
  /// The policy's exchange.
  std::variant<GatherExchange<MemorySpace>, HaloExchange<MemorySpace>> exchange;

  /// Whether these tables were built for `l` and the window `r`.
  bool matches(const AxisLayout& l, const WindowRange& r) const {
    return ready && r.window == range.window && l.cache == layout.cache &&
           l.chunk == layout.chunk && l.ranks == layout.ranks && l.whole_axis == layout.whole_axis;
  }

  /// Builds the tables of `l` on rank `me` for the window `r`, with the exchange `Exchange` and,
  /// for the whole-axis layout, the assembly.
  template <class Exchange>
  void build(const AxisLayout& l, int me, const WindowRange& r) {
    layout = l;
    range = r;
    reshard.build(l, me, r);
    if (l.whole_axis) {
      if (!assembly) assembly.emplace();
      assembly->build(l, me, reshard.plan);
    } else {
      assembly.reset();
    }
    if (!std::holds_alternative<Exchange>(exchange)) exchange.template emplace<Exchange>();
    std::get<Exchange>(exchange).build(l, me, r);
    ready = true;
  }

  /// Bytes of the device tables.
  std::size_t bytes() const {
    std::size_t b = reshard.bytes() + (assembly ? assembly->bytes() : 0);
    std::visit([&](const auto& x) { b += x.bytes(); }, exchange);
    return b;
  }
};

}  // namespace ctxpar::swa::impl
