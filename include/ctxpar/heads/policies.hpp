/// \file
/// Tag types choosing how mechanism C splits heads and orders tokens.
#pragma once

#include <type_traits>

namespace ctxpar::heads {

/// Every rank gets `nheads / P` heads; the transposes use one `MPI_Alltoall`. Requires
/// `nheads % P == 0`, `T % P == 0`, and `P % ngroups == 0` (when `ngroups < P`) or
/// `ngroups % P == 0`.
struct EvenHeads {};

/// Head blocks as even as possible (the first `nheads % P` ranks get one more head, a rank may get
/// none); key groups follow the heads that use them. The transposes use one `MPI_Alltoallv`; under
/// `Contiguous` the token shards may be uneven too (the `torch.chunk` rule).
struct UnevenHeads {};

/// Sequence-parallel shards hold contiguous token ranges in natural order.
struct Contiguous {};

/// Sequence-parallel shards hold the load-balanced zigzag order: the sequence (every packed
/// sequence on its own) is cut into `2P` chunks and rank `r` holds chunks `r` and `2P - 1 - r`.
struct Zigzag {};

/// True for the head-split policies.
template <class T>
inline constexpr bool is_head_policy_v =
    std::is_same_v<T, EvenHeads> || std::is_same_v<T, UnevenHeads>;

/// True for the token-order policies.
template <class T>
inline constexpr bool is_token_order_v = std::is_same_v<T, Contiguous> || std::is_same_v<T, Zigzag>;

}  // namespace ctxpar::heads
