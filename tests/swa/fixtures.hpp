// Deterministic streams for the sliding-window attention tests: inputs generated from
// (seed, global index) in the tested scalar type, the same values widened to fp64 for the oracle,
// conversion of token ranges to Kokkos views, and comparisons against the oracle with its bounds.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "ctxpar/core/storage.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/cache.hpp"
#include "ctxpar/swa/tensors.hpp"
#include "ctxpar_test/harness.hpp"
#include "oracle.hpp"

namespace ctxpar::test::swa {

/// Shape and content of a whole stream.
struct StreamSpec {
  std::int64_t tokens = 16, hq = 2, hkv = 1, dim = 8;
  std::int64_t window = 4;
  std::int64_t first_position = 0;
  std::int64_t position_step = 1;             // > 1 leaves gaps between positions
  std::vector<std::int64_t> document_starts;  // token indices where a new document starts
  std::uint64_t seed = 1;
  double base = 10000.0;
};

/// The stream in fp64 (values already rounded to the tested scalar type) and a dout.
struct Stream {
  Problem problem;
  Tensor dout;
};

template <class Scalar>
Tensor random_tensor(std::uint64_t seed, std::int64_t t, std::int64_t h, std::int64_t d) {
  Tensor x(t, h, d);
  for (std::size_t i = 0; i < x.data.size(); ++i)
    x.data[i] = static_cast<double>(ctxpar::widen(ctxpar::narrow<Scalar>(uniform(seed, i))));
  return x;
}

template <class Scalar>
Stream make_stream(const StreamSpec& s) {
  Stream st;
  Problem& p = st.problem;
  p.q = random_tensor<Scalar>(s.seed * 16 + 1, s.tokens, s.hq, s.dim);
  p.k = random_tensor<Scalar>(s.seed * 16 + 2, s.tokens, s.hkv, s.dim);
  p.v = random_tensor<Scalar>(s.seed * 16 + 3, s.tokens, s.hkv, s.dim);
  st.dout = random_tensor<Scalar>(s.seed * 16 + 4, s.tokens, s.hq, s.dim);
  for (std::int64_t i = 0; i < s.tokens; ++i)
    p.pos.push_back(s.first_position + i * s.position_step);
  if (!s.document_starts.empty()) {
    std::int32_t id = 0;
    for (std::int64_t i = 0; i < s.tokens; ++i) {
      for (auto b : s.document_starts)
        if (b == i && i > 0) ++id;
      p.ids.push_back(id + 7);
    }
  }
  p.window = s.window;
  p.base = s.base;
  return st;
}

/// Tokens [from, from + n) of an fp64 tensor as a view of `Scalar` in `MemorySpace`.
template <class Scalar, class MemorySpace>
ctxpar::swa::Tensor<Scalar, MemorySpace> to_view(const Tensor& x, std::int64_t from, std::int64_t n,
                                                 const char* label = "test") {
  ctxpar::swa::Tensor<Scalar, MemorySpace> v(std::string(label), n, x.heads, x.dim);
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t a = 0; a < x.heads; ++a)
      for (std::int64_t d = 0; d < x.dim; ++d)
        h(i, a, d) = ctxpar::narrow<Scalar>(x(from + i, a, d));
  Kokkos::deep_copy(v, h);
  return v;
}

template <class MemorySpace, class T, class ViewT>
ViewT vector_view(const std::vector<T>& x, std::int64_t from, std::int64_t n) {
  ViewT v("test", x.empty() ? 0 : n);
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(h.extent(0)); ++i) h(i) = x[from + i];
  Kokkos::deep_copy(v, h);
  return v;
}

/// Tokens [from, from + n) of the stream as a chunk.
template <class Scalar, class MemorySpace>
ctxpar::swa::Chunk<Scalar, MemorySpace> chunk_of(const Problem& p, std::int64_t from,
                                                 std::int64_t n) {
  ctxpar::swa::Chunk<Scalar, MemorySpace> c;
  c.q = to_view<Scalar, MemorySpace>(p.q, from, n);
  c.k = to_view<Scalar, MemorySpace>(p.k, from, n);
  c.v = to_view<Scalar, MemorySpace>(p.v, from, n);
  c.pos =
      vector_view<MemorySpace, std::int64_t, ctxpar::swa::Positions<MemorySpace>>(p.pos, from, n);
  c.ids = vector_view<MemorySpace, std::int32_t, ctxpar::swa::Ids<MemorySpace>>(p.ids, from, n);
  return c;
}

/// Tokens [from, from + n) of the stream as a raw K/V block (a cache).
template <class Scalar, class MemorySpace>
ctxpar::swa::KvBlock<Scalar, MemorySpace> block_of(const Problem& p, std::int64_t from,
                                                   std::int64_t n) {
  ctxpar::swa::KvBlock<Scalar, MemorySpace> c;
  c.k = to_view<Scalar, MemorySpace>(p.k, from, n);
  c.v = to_view<Scalar, MemorySpace>(p.v, from, n);
  c.pos =
      vector_view<MemorySpace, std::int64_t, ctxpar::swa::Positions<MemorySpace>>(p.pos, from, n);
  c.ids = vector_view<MemorySpace, std::int32_t, ctxpar::swa::Ids<MemorySpace>>(p.ids, from, n);
  return c;
}

/// Compares `n` tokens of `actual` with tokens [from, from + n) of `expected` within `bound`
/// (scaled by `factor`), printing the first mismatch with its (token, head, d) index.
template <class View>
bool close_to(const std::string& what, const View& actual, const Tensor& expected,
              const Tensor& bound, std::int64_t from, double factor = 1.0) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), actual);
  const std::int64_t heads = expected.heads, dim = expected.dim;
  const std::int64_t n = static_cast<std::int64_t>(h.extent(0)) * heads * dim;
  if (static_cast<std::int64_t>(h.extent(1)) != heads ||
      static_cast<std::int64_t>(h.extent(2)) != dim) {
    std::cerr << what << ": shape mismatch\n";
    return false;
  }
  auto idx = [&](std::int64_t x) {
    return std::make_tuple(x / (heads * dim), (x / dim) % heads, x % dim);
  };
  return all_close(
      what, n,
      [&](std::int64_t x) {
        auto [i, a, d] = idx(x);
        return static_cast<double>(ctxpar::widen(h(i, a, d)));
      },
      [&](std::int64_t x) {
        auto [i, a, d] = idx(x);
        return expected(from + i, a, d);
      },
      [&](std::int64_t x) {
        auto [i, a, d] = idx(x);
        return factor * bound(from + i, a, d);
      },
      [&](std::int64_t x) {
        auto [i, a, d] = idx(x);
        std::ostringstream s;
        s << "(token " << from + i << ", head " << a << ", d " << d << ")";
        return s.str();
      });
}

/// Bitwise equality of two views of the same shape.
template <class A, class B>
bool bitwise_equal(const A& a, const B& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  if (ha.span() != hb.span()) return false;
  if (ha.span() == 0) return true;  // empty views may have no storage (memcmp needs pointers)
  return std::memcmp(ha.data(), hb.data(), ha.span() * sizeof(typename decltype(ha)::value_type)) ==
         0;
}

/// The inputs of a direct kernel call: `tq` queries (tokens `[q0, q0 + tq)`) against `nk` keys
/// (tokens `[k0, k0 + nk)`) of a stream, unrotated (the kernels do not care), scale 0.5.
template <class Scalar, class Mem>
ctxpar::swa::AttentionInputs<Scalar, Mem> direct_inputs(const Stream& s, std::int64_t q0,
                                                        std::int64_t tq, std::int64_t k0,
                                                        std::int64_t nk) {
  ctxpar::swa::AttentionInputs<Scalar, Mem> in;
  in.q = to_view<Scalar, Mem>(s.problem.q, q0, tq);
  in.k = to_view<Scalar, Mem>(s.problem.k, k0, nk);
  in.v = to_view<Scalar, Mem>(s.problem.v, k0, nk);
  in.q_pos = vector_view<Mem, std::int64_t, ctxpar::swa::Positions<Mem>>(s.problem.pos, q0, tq);
  in.q_ids = vector_view<Mem, std::int32_t, ctxpar::swa::Ids<Mem>>(s.problem.ids, q0, tq);
  in.k_pos = vector_view<Mem, std::int64_t, ctxpar::swa::Positions<Mem>>(s.problem.pos, k0, nk);
  in.k_ids = vector_view<Mem, std::int32_t, ctxpar::swa::Ids<Mem>>(s.problem.ids, k0, nk);
  in.key_origin = k0;
  in.scale = 0.5;
  return in;
}

/// True when every element of `view` (any storage type, widened) equals `value`.
template <class View>
bool all_equal(const View& view, double value) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  bool ok = true;
  for (std::size_t i = 0; i < h.span(); ++i) ok = ok && ctxpar::widen(h.data()[i]) == value;
  return ok;
}

}  // namespace ctxpar::test::swa
