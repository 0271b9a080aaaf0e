// Options whose value picks a compile-time tag (`--policy halo`, `--layout zigzag`, ...). Each such
// option is a table of {spelling, tag} pairs; `choose` reads the option and refuses a value the
// table does not list, naming the option and every accepted value; `Choices::visit` calls a
// generic lambda with the chosen tag. The tables the subcommands share are here, so a spelling and
// the tag it selects are written once for every subcommand that offers them.
#pragma once

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "command.hpp"
#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/policy.hpp"
#include "ctxpar/partition/head_partition.hpp"
#include "ctxpar/partition/zigzag.hpp"
#include "ctxpar/swa/options.hpp"
#include "ctxpar/swa/policies.hpp"

namespace ctxpar::cli {

/// One value of a choice option: its spelling on the command line, selecting the tag `Tag`.
template <class Tag>
struct Named {
  const char* name;  ///< what the user types after the option
};

/// The values one option accepts, each selecting a tag type, in the order the usage text lists
/// them. A value is named by its index in the table (what `choose` returns).
template <class... Tags>
class Choices {
 public:
  /// The table, e.g. `Choices{Named<Contiguous>{"contiguous"}, Named<Zigzag>{"zigzag"}}`.
  constexpr explicit Choices(Named<Tags>... values) : names_{values.name...} {}

  /// Number of values.
  static constexpr int size() noexcept { return static_cast<int>(sizeof...(Tags)); }

  /// The spelling of value `index`.
  const char* name(int index) const {
    check(index);
    return names_[static_cast<std::size_t>(index)];
  }

  /// The index of the value spelt `text`, -1 when the table does not list it.
  constexpr int index(std::string_view text) const {
    for (int i = 0; i < size(); ++i)
      if (text == names_[static_cast<std::size_t>(i)]) return i;
    return -1;
  }

  /// Every spelling, as a message lists them: "a, b or c".
  std::string list() const {
    std::string out;
    for (int i = 0; i < size(); ++i)
      out += std::string(i == 0            ? ""
                         : i + 1 == size() ? " or "
                                           : ", ") +
             names_[static_cast<std::size_t>(i)];
    return out;
  }

  /// True when value `index` selects `Tag`.
  template <class Tag>
  bool is(int index) const {
    return visit(index, [](auto tag) { return std::is_same_v<decltype(tag), Tag>; });
  }

  /// Calls `f(tag)` with a value of the tag that value `index` selects and returns its result
  /// (the same type for every tag). `index` comes from `choose` or `index`: one outside the table
  /// is a bug of the tool, thrown as `std::logic_error`.
  template <class F>
  decltype(auto) visit(int index, F&& f) const {
    check(index);
    return visit_from<0, Tags...>(index, f);
  }

 private:
  static void check(int index) {
    if (index < 0 || index >= size())
      throw std::logic_error("ctxpar::cli::Choices: no value at index " + std::to_string(index));
  }

  template <int I, class Tag, class... Rest, class F>
  static decltype(auto) visit_from(int index, F& f) {
    if constexpr (sizeof...(Rest) == 0) {
      return f(Tag{});  // `check` left only this one
    } else {
      if (index == I) return f(Tag{});
      return visit_from<I + 1, Rest...>(index, f);
    }
  }

  std::array<const char*, sizeof...(Tags)> names_;
};

/// The index in `choices` of the value of option `--key`; `fallback` when the option is absent,
/// required when `fallback` is null. A value the table does not list is a `UsageError` of the
/// subcommand naming the option, every accepted value and the value given — the same on every
/// rank, since every rank reads the same command line.
template <class... Tags>
int choose(const Args& args, const std::string& key, const Choices<Tags...>& choices,
           const char* fallback = nullptr) {
  const std::string value = fallback ? args.get(key, fallback) : args.get<std::string>(key);
  const int index = choices.index(value);
  if (index < 0)
    throw UsageError("ctxpar " + args.command(), -1, "unknown --" + key, choices.list(), value);
  return index;
}

/// How a sequence is sharded over the ranks (`--layout` of chunkwise, heads and hybrid).
inline constexpr Choices layouts{Named<Contiguous>{"contiguous"}, Named<Zigzag>{"zigzag"}};

/// How sliding-window attention reaches the keys (`swa --policy`, `hybrid --swa-policy`).
inline constexpr Choices swa_policies{Named<swa::RopeBeforeGather>{"allgather"},
                                      Named<swa::RopeAfterGather>{"rope-after"},
                                      Named<swa::HaloKV>{"halo"}};

/// Which attention kernels sliding-window attention runs (`swa --kernels`): a run-time option, so
/// each tag carries its `swa::KernelChoice` as `value`.
template <swa::KernelChoice K>
using KernelTag = std::integral_constant<swa::KernelChoice, K>;
inline constexpr Choices swa_kernel_choices{
    Named<KernelTag<swa::KernelChoice::automatic>>{"automatic"},
    Named<KernelTag<swa::KernelChoice::portable>>{"portable"},
    Named<KernelTag<swa::KernelChoice::host_fused>>{"host-fused"},
    Named<KernelTag<swa::KernelChoice::host_unfused>>{"host-unfused"},
    Named<KernelTag<swa::KernelChoice::tensor_core>>{"tensor-core"}};

/// How a streamed sliding-window step shards its key axis (`swa --layout`).
inline constexpr Choices swa_kv_layouts{Named<swa::SegmentChunks>{"segments"},
                                        Named<swa::WholeAxisChunks>{"whole-axis"}};

/// How chunkwise summaries are composed across ranks (`chunkwise --compose`,
/// `hybrid --gdn-policy`).
inline constexpr Choices compositions{Named<chunkwise::GatherFold>{"gather"},
                                      Named<chunkwise::ScanCompose>{"scan"}};

/// How the chunkwise families' per-chunk products multiply (`chunkwise --products`): a
/// run-time option, so each tag carries its `chunkwise::ChunkProducts` as `value`.
template <chunkwise::ChunkProducts P>
using ProductsTag = std::integral_constant<chunkwise::ChunkProducts, P>;
inline constexpr Choices chunk_products{
    Named<ProductsTag<chunkwise::ChunkProducts::exact>>{"exact"},
    Named<ProductsTag<chunkwise::ChunkProducts::tf32>>{"tf32"},
    Named<ProductsTag<chunkwise::ChunkProducts::bfloat16>>{"bfloat16"},
    Named<ProductsTag<chunkwise::ChunkProducts::float16>>{"float16"},
    Named<ProductsTag<chunkwise::ChunkProducts::automatic>>{"automatic"}};

/// How heads are split over the ranks (`hybrid --head-policy`; `heads` takes the flag `--uneven`).
inline constexpr Choices head_policies{Named<EvenHeads>{"even"}, Named<UnevenHeads>{"uneven"}};

}  // namespace ctxpar::cli
