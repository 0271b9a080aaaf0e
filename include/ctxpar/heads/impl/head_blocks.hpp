/// \file
/// Which heads and key groups each rank owns under mechanism C (host side).
#pragma once

#include <cstdint>

namespace ctxpar::heads::impl {

/// Head block `[begin(j), end(j))` of rank `j` and the key groups its heads use. With `uneven`,
/// the first `nheads % parts` ranks get one extra head; otherwise every rank gets
/// `nheads / parts` (the caller has checked divisibility). A rank's key groups are exactly the
/// groups its heads read (`h / (nheads / ngroups)`), so a group is repeated on several ranks when
/// `ngroups < parts`.
struct HeadBlocks {
  int nheads = 1;     ///< heads in the layer
  int ngroups = 1;    ///< key groups in the layer (divides nheads)
  int parts = 1;      ///< ranks
  bool uneven = false;

  int heads_per_group() const { return nheads / ngroups; }
  int begin(int j) const {
    const int base = nheads / parts, extra = nheads % parts;
    return uneven ? j * base + (j < extra ? j : extra) : j * base;
  }
  int end(int j) const { return begin(j + 1); }
  int count(int j) const { return end(j) - begin(j); }
  int group_begin(int j) const { return begin(j) / heads_per_group(); }
  int group_end(int j) const {
    return count(j) == 0 ? group_begin(j) : (end(j) - 1) / heads_per_group() + 1;
  }
  int group_count(int j) const { return group_end(j) - group_begin(j); }
};

}  // namespace ctxpar::heads::impl
