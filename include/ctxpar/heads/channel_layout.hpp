/// \file
/// Channel-layout descriptors: how the channel axis of a token-major activation splits into
/// sections partitioned by heads or by key groups, with the householder copies folded.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ctxpar/core/error.hpp"
#include "ctxpar/core/fingerprint.hpp"
#include "ctxpar/heads/skip_term.hpp"
#include "ctxpar/partition/head_partition.hpp"

namespace ctxpar::heads {

/// What a section of the channel axis is split by.
enum class SectionKind : int {
  heads = 0,   ///< one unit per head (V, z, b, a, y)
  groups = 1,  ///< one unit per key group (K, Q); repeated on every rank whose heads use it
};

/// One section of the channel axis: `copies` householder copies (the slower axis), each of
/// `units` heads or key groups of `width` channels. Rank `j` receives, from every copy, the same
/// unit range — the householder fold — so each copy is partitioned identically.
struct Section {
  std::string name;                       ///< for messages and reports, e.g. "V"
  int copies = 1;                         ///< householder copies M (1 for unreplicated sections)
  int units = 1;                          ///< heads or key groups in one copy
  int width = 1;                          ///< channels per unit (headdim, d_state or 1)
  SectionKind kind = SectionKind::heads;  ///< split by heads or by key groups

  /// Channels of the whole section at `P = 1`.
  std::int64_t channels() const { return std::int64_t{copies} * units * width; }
};

/// An ordered list of sections over one head/group structure (`nheads`, `ngroups`). Host-side
/// value type; plans copy it.
class ChannelLayout {
 public:
  ChannelLayout() = default;
  /// A layout over `nheads` heads that use `ngroups` key groups (head `h` uses group
  /// `h / (nheads / ngroups)`).
  ChannelLayout(int nheads, int ngroups, std::vector<Section> sections)
      : nheads_(nheads), ngroups_(ngroups), sections_(std::move(sections)) {}

  /// A single head-split section of `nheads` heads of `headdim` channels: the plain
  /// `[T/P, nheads·headdim] ⇄ [T, nheads·headdim/P]` transpose.
  static ChannelLayout heads_only(int nheads, int headdim, const std::string& name = "heads") {
    return ChannelLayout(nheads, 1, {Section{name, 1, nheads, headdim, SectionKind::heads}});
  }

  /// Heads `H` of the layer.
  int nheads() const { return nheads_; }
  /// Key groups `G` (divides `H`).
  int ngroups() const { return ngroups_; }
  /// The sections, in channel order.
  const std::vector<Section>& sections() const { return sections_; }

  /// Channels at `P = 1`.
  std::int64_t channels() const {
    std::int64_t c = 0;
    for (const Section& s : sections_) c += s.channels();
    return c;
  }
  /// First channel of section `s` at `P = 1`.
  std::int64_t offset(std::size_t s) const {
    std::int64_t c = 0;
    for (std::size_t i = 0; i < s; ++i) c += sections_[i].channels();
    return c;
  }
  /// Index of the section called `name` (throws when absent).
  std::size_t find(const std::string& name) const {
    for (std::size_t i = 0; i < sections_.size(); ++i)
      if (sections_[i].name == name) return i;
    throw Error("ctxpar::heads::ChannelLayout", -1, "the layout must have a section " + name, name,
                "no such section");
  }

  /// Units of section `s` that rank `j` of `blocks` owns: its head block or the groups its heads
  /// use.
  std::pair<int, int> unit_range(std::size_t s, const KeyGroupPartition& blocks, int j) const {
    if (sections_[s].kind == SectionKind::heads)
      return {blocks.heads.begin(j), blocks.heads.end(j)};
    return {blocks.begin(j), blocks.end(j)};
  }
  /// Channels of section `s` on rank `j`.
  std::int64_t local_channels(std::size_t s, const KeyGroupPartition& blocks, int j) const {
    const auto [b, e] = unit_range(s, blocks, j);
    return std::int64_t{sections_[s].copies} * (e - b) * sections_[s].width;
  }
  /// Channels on rank `j`, all sections.
  std::int64_t local_channels(const KeyGroupPartition& blocks, int j) const {
    std::int64_t c = 0;
    for (std::size_t s = 0; s < sections_.size(); ++s) c += local_channels(s, blocks, j);
    return c;
  }
  /// First local channel of section `s` on rank `j`.
  std::int64_t local_offset(std::size_t s, const KeyGroupPartition& blocks, int j) const {
    std::int64_t c = 0;
    for (std::size_t i = 0; i < s; ++i) c += local_channels(i, blocks, j);
    return c;
  }

  /// For every channel rank `j` holds after the transpose, in local order (section, copy, unit,
  /// channel), the `P = 1` channel it comes from: the index map of the partition and the fold.
  std::vector<std::int64_t> channel_map(const KeyGroupPartition& blocks, int j) const {
    std::vector<std::int64_t> map;
    std::int64_t base = 0;
    for (std::size_t s = 0; s < sections_.size(); ++s) {
      const Section& sec = sections_[s];
      const auto [b, e] = unit_range(s, blocks, j);
      for (int m = 0; m < sec.copies; ++m)
        for (int u = b; u < e; ++u)
          for (int w = 0; w < sec.width; ++w)
            map.push_back(base + (std::int64_t{m} * sec.units + u) * sec.width + w);
      base += sec.channels();
    }
    return map;
  }

  /// A fingerprint of the whole layout, for `Preconditions::require_same`.
  std::int64_t fingerprint_value() const {
    // Names only label messages; everything that places a channel is hashed, in order.
    std::vector<std::int64_t> fields{nheads_, ngroups_};
    for (const Section& s : sections_)
      fields.insert(fields.end(), {s.copies, s.units, s.width, static_cast<std::int64_t>(s.kind)});
    return ctxpar::fingerprint(fields);
  }

 private:
  int nheads_ = 1;
  int ngroups_ = 1;
  std::vector<Section> sections_;
};

/// The shape of a Gated Delta Product layer (one tensor-parallel rank's worth, `P = 1`).
struct GdpShape {
  int nheads = 1;                  ///< heads H
  int headdim = 1;                 ///< value channels per head d
  int ngroups = 1;                 ///< key groups G (divides H)
  int d_state = 1;                 ///< key channels per group N (the state is N × d per head)
  int householder = 1;             ///< householder copies M
  int conv_width = 4;              ///< depthwise causal conv width w
  SkipTerm skip = SkipTerm::none;  ///< whether the layer has `D`, per head or per channel

  /// Elements of `D` (`0`, `H` or `d_inner`).
  std::int64_t skip_size() const { return heads::skip_size(skip, nheads, headdim); }

  /// `d_inner = H · d`.
  std::int64_t d_inner() const { return std::int64_t{nheads} * headdim; }
  /// Channels of the conv at `P = 1`: `d_inner·M + G·N·(M + 1)`.
  std::int64_t conv_channels() const {
    return d_inner() * householder + std::int64_t{ngroups} * d_state * (householder + 1);
  }

  /// The input-projection layout `[z | V | K | Q | b | a]`.
  ChannelLayout input_layout() const {
    return ChannelLayout(nheads, ngroups,
                         {Section{"z", 1, nheads, headdim, SectionKind::heads},
                          Section{"V", householder, nheads, headdim, SectionKind::heads},
                          Section{"K", householder, ngroups, d_state, SectionKind::groups},
                          Section{"Q", 1, ngroups, d_state, SectionKind::groups},
                          Section{"b", householder, nheads, 1, SectionKind::heads},
                          Section{"a", 1, nheads, 1, SectionKind::heads}});
  }
  /// The conv layout `[V | K | Q]` (the same partition as the input layout's sections).
  ChannelLayout conv_layout() const {
    return ChannelLayout(nheads, ngroups,
                         {Section{"V", householder, nheads, headdim, SectionKind::heads},
                          Section{"K", householder, ngroups, d_state, SectionKind::groups},
                          Section{"Q", 1, ngroups, d_state, SectionKind::groups}});
  }
  /// The output layout (y or z): `d_inner` channels split by heads, no householder copies.
  ChannelLayout output_layout() const {
    return ChannelLayout(nheads, ngroups, {Section{"y", 1, nheads, headdim, SectionKind::heads}});
  }
};

}  // namespace ctxpar::heads
