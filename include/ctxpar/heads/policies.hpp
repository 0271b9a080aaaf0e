/// \file
/// Tag types choosing how mechanism C splits heads and orders tokens.
#pragma once

#include "ctxpar/core/impl/one_of.hpp"
#include "ctxpar/partition/head_partition.hpp"
#include "ctxpar/partition/zigzag.hpp"

namespace ctxpar::heads {

// The policy tags are the partition layer's (`ctxpar::EvenHeads`, `ctxpar::UnevenHeads` from
// head_partition.hpp; `ctxpar::Contiguous`, `ctxpar::ZigzagPerSequence` from zigzag.hpp),
// re-exported here. Under mechanism C, `EvenHeads` also means one `MPI_Alltoall` (so `T % P == 0`),
// and `UnevenHeads` one `MPI_Alltoallv`, with uneven token shards allowed under `Contiguous`.
using ::ctxpar::Contiguous;
using ::ctxpar::EvenHeads;
using ::ctxpar::UnevenHeads;
using ::ctxpar::ZigzagPerSequence;

/// True for the head-split policies.
template <class T>
inline constexpr bool is_head_policy_v = ctxpar::impl::is_one_of_v<T, EvenHeads, UnevenHeads>;

/// True for the token orders of the head transposes: `Contiguous` and `ZigzagPerSequence` (the
/// transposes zigzag every packed sequence on its own).
template <class T>
inline constexpr bool is_token_order_v =
    ctxpar::impl::is_one_of_v<T, Contiguous, ZigzagPerSequence>;

}  // namespace ctxpar::heads
