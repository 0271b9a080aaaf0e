/// \file
/// `ctxpar::fingerprint`: one 64-bit hash of a plan's integers, index vectors or names, so that
/// ranks agree on a whole plan with one `Preconditions::require_same` instead of one per value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace ctxpar {

namespace impl {

/// 64-bit FNV-1a: the one hash behind every `ctxpar::fingerprint` overload. Not cryptographic;
/// it only has to make an accidental disagreement between ranks visible.
class Fnv1a {
 public:
  /// Mixes in the low byte of `byte`.
  void add_byte(std::uint64_t byte) {
    hash_ ^= byte & 0xffu;
    hash_ *= 1099511628211ull;
  }
  /// Mixes in the 8 bytes of `value`, least significant first, so that the hash does not depend
  /// on the host's byte order.
  void add(std::int64_t value) {
    for (int byte = 0; byte < 8; ++byte) add_byte(static_cast<std::uint64_t>(value) >> (8 * byte));
  }
  /// The hash of everything mixed in so far.
  std::int64_t value() const { return static_cast<std::int64_t>(hash_); }

 private:
  std::uint64_t hash_ = 1469598103934665603ull;
};

}  // namespace impl

/// A 64-bit fingerprint of several integers (FNV-1a over their bytes, in order), for
/// `Preconditions::require_same` on a whole plan at once.
inline std::int64_t fingerprint(std::initializer_list<std::int64_t> values) {
  impl::Fnv1a hash;
  for (std::int64_t v : values) hash.add(v);
  return hash.value();
}

/// A 64-bit fingerprint of a vector of integers (sequence ids, `cu_seqlens`, per-rank counts): its
/// length, then its elements. The length comes first so that no vector hashes like a longer one
/// that merely starts the same way.
template <class Integer>
std::int64_t fingerprint(const std::vector<Integer>& values) {
  static_assert(std::is_integral_v<Integer>, "ctxpar::fingerprint: the vector must hold integers");
  impl::Fnv1a hash;
  hash.add(static_cast<std::int64_t>(values.size()));
  for (Integer v : values) hash.add(static_cast<std::int64_t>(v));
  return hash.value();
}

/// A 64-bit fingerprint (FNV-1a) of a name, e.g. a policy tag's, for `require_same`.
inline std::int64_t fingerprint(const char* name) {
  impl::Fnv1a hash;
  for (const char* c = name; *c != '\0'; ++c) hash.add_byte(static_cast<unsigned char>(*c));
  return hash.value();
}

}  // namespace ctxpar
