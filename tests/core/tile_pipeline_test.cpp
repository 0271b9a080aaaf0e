// Staging tiles ahead of their use (core/impl/tile_pipeline.hpp) on the host: an asynchronous copy
// lands only at the wait that retires its group, so a kernel that reads a tile before waiting for
// it fails in CPU CI as it would on a GPU; and the double-buffered loop stages tile t + 1 into the
// other buffer before the team uses tile t, uses every tile once, in order, from the buffer it was
// staged into, after waiting for it, and waits for the team around every use.
#include <boost/test/unit_test.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ctxpar/core/impl/tile_pipeline.hpp"

namespace {

using ctxpar::impl::AsyncCopies;

// 16 bytes holding `value` in every word.
struct alignas(16) Piece {
  std::uint32_t word[4];
  explicit Piece(std::uint32_t value = 0) : word{value, value, value, value} {}
  bool holds(std::uint32_t value) const {
    return word[0] == value && word[1] == value && word[2] == value && word[3] == value;
  }
};

// A team of one thread, as the host runs the tensor-core kernels, that logs its barriers.
struct LoggingMember {
  std::string* log;
  void team_barrier() const { *log += "|"; }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(core_tile_pipeline)

BOOST_AUTO_TEST_CASE(copies_land_at_the_wait_that_retires_their_group) {
  std::array<Piece, 3> src = {Piece(1), Piece(2), Piece(3)};
  std::array<Piece, 3> dst;
  AsyncCopies<4> copies;
  copies.copy(&dst[0], &src[0]);
  copies.copy(&dst[1], &src[1]);
  copies.commit();
  copies.copy(&dst[2], &src[2]);
  copies.commit();
  // Issued, not waited for: nothing has landed.
  BOOST_TEST(copies.outstanding() == 3);
  BOOST_TEST((dst[0].holds(0) && dst[1].holds(0) && dst[2].holds(0)));
  // One group may stay pending: the first group lands, the second does not.
  copies.wait<1>();
  BOOST_TEST(copies.outstanding() == 1);
  BOOST_TEST((dst[0].holds(1) && dst[1].holds(2) && dst[2].holds(0)));
  // A source changed before the wait is what lands: the copy reads it at the wait, the latest
  // moment the hardware may.
  src[2] = Piece(9);
  copies.wait<0>();
  BOOST_TEST(copies.outstanding() == 0);
  BOOST_TEST(dst[2].holds(9));
  // Waiting with nothing pending does nothing.
  copies.wait<0>();
  BOOST_TEST(dst[0].holds(1));
}

BOOST_AUTO_TEST_CASE(zero_pieces_are_stored_at_once) {
  Piece p(5);
  ctxpar::impl::store_zero_piece(&p);
  BOOST_TEST(p.holds(0));
  BOOST_TEST(ctxpar::impl::async_copy_aligned(&p));
  BOOST_TEST(!ctxpar::impl::async_copy_aligned(reinterpret_cast<const char*>(&p) + 2));
}

// The pipelined loop over `n` tiles with `Stages` buffers, each tile's value copied into its
// buffer: the log of stagings (S), uses (U) and barriers (|), and whether every use saw its own
// tile in its buffer.
template <int Stages>
bool pipelined_run(int n, std::string& log) {
  std::vector<Piece> tiles;
  for (int t = 0; t < n; ++t) tiles.emplace_back(100 + t);
  std::array<Piece, Stages> buffer;
  AsyncCopies<Stages> copies;
  bool ok = true;
  int next_use = 0;
  const LoggingMember team{&log};
  ctxpar::impl::pipelined_tiles<Stages>(
      team, copies, n,
      [&](std::int64_t t, int b) {
        log += "S" + std::to_string(t) + "b" + std::to_string(b);
        copies.copy(&buffer[b], &tiles[t]);
      },
      [&](std::int64_t t, int b) {
        log += "U" + std::to_string(t) + "b" + std::to_string(b);
        ok = t == next_use++ && buffer[b].holds(static_cast<std::uint32_t>(100 + t)) && ok;
      });
  return ok && next_use == n && copies.outstanding() == 0;
}

BOOST_AUTO_TEST_CASE(one_buffer_stages_waits_and_uses_each_tile_in_turn) {
  std::string log;
  BOOST_TEST(pipelined_run<1>(3, log));
  BOOST_TEST(log == "S0b0|U0b0|S1b0|U1b0|S2b0|U2b0|");
  log.clear();
  BOOST_TEST(pipelined_run<1>(0, log));
  BOOST_TEST(log.empty());
}

BOOST_AUTO_TEST_CASE(two_buffers_stage_the_next_tile_before_using_this_one) {
  std::string log;
  BOOST_TEST(pipelined_run<2>(4, log));
  BOOST_TEST(log == "S0b0S1b1|U0b0|S2b0|U1b1|S3b1|U2b0||U3b1|");
  for (int n : {0, 1, 2, 5}) {
    log.clear();
    BOOST_TEST(pipelined_run<2>(n, log), "n = " << n << ": " << log);
  }
  log.clear();
  pipelined_run<2>(1, log);
  BOOST_TEST(log == "S0b0|U0b0|");
}

BOOST_AUTO_TEST_SUITE_END()
