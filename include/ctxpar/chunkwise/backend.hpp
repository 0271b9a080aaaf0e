/// \file
/// The chunkwise backend contract: the four local methods every model family implements, and a
/// compile-time checker for it. The driver (`CpPlan`'s `forward` / `backward`) owns all
/// communication; a backend never touches the communicator.
///
/// ## The contract
///
/// A backend type `B` is a small copyable object (options such as the chunk size and the scale)
/// with these members:
///
/// Types:
/// - `scalar_type` (activations: `float` or `double`), `memory_space`;
/// - `transition_type`: one of `IdentityTransition`, `ScalarTransition`, `DiagonalTransition`,
///   `DenseTransition` (the structure of `M`; fixes summary sizes and the composition kernel);
/// - `inputs_type`: a struct of views (`q [T,H,K]`, `k [T,H,K]`, `v [T,H,V]`, gates, `β`, … as
///   the family needs), token-major and `LayoutRight`;
/// - `gradients_type`: a struct of views with one gradient per differentiable input, same shapes;
/// - `saved_type`: default-constructible, what `forward_prepare`/`forward_apply` keep for the
///   other methods (views only; no host pointers into the inputs): the per-call memory, one per
///   forward in flight, owned by the caller;
/// - `table_type`: the per-slot table, what depends only on the shapes and a slot's local
///   sequences (a chunk table, say). The plan builds one per local slot when it is built
///   (`make_table`) and owns it; every method of a call on that slot reads it and none writes what
///   a later call depends on, so all saved bundles of the slot share it. `NoTable` when the family
///   needs none.
///
/// Constants and plan queries:
/// - `static constexpr const char* family_name`, `static constexpr int family_id` (plan
///   fingerprint: every rank must use the same family);
/// - `int chunk_size() const`;
/// - `ChunkwiseShape shape(const inputs_type&) const` (`T, H, K, V`);
/// - `void check(Preconditions&, const inputs_type&) const`: records local input violations
///   (shape mismatches between q/k/v/gates/β, `K` or `V` zero, …) without communicating;
/// - `void check_gradients(Preconditions&, const inputs_type&, const gradients_type&) const`;
/// - `inputs_type slice(const inputs_type&, std::int64_t begin, std::int64_t end) const` and the
///   same for `gradients_type`: the token range `[begin, end)` (zigzag shards are two ranges);
/// - `bool has_non_finite(const ExecutionSpace&, const inputs_type&) const` (NaN/Inf check flag);
/// - `table_type make_table(const LocalSequences& seqs, const ChunkwiseShape& shape) const`: the
///   table of a slot holding `seqs` of inputs of `shape` (`shape.tokens` = the slot's tokens); may
///   allocate (it runs once per slot, at plan construction).
///
/// The four methods (all templated on `ExecutionSpace`, taken first; `seqs` describes the
/// shard's local sequences, `seqs.length() >= 1`; empty shards are handled by the driver; `table`
/// is the slot's, built by `make_table` for these `seqs` and the shape of these inputs):
///
/// 1. `forward_prepare(space, inputs, seqs, table, SummaryViews summary, saved_type& saved)`:
///    write the forward summary `(M, dS)` of the shard's **trailing fragment** (local sequence
///    `seqs.count()-1`) computed with zero incoming state, and without that sequence's own initial
///    state even when it starts here (the driver folds initial states in). May cache local work
///    in `saved`.
/// 2. `forward_apply(space, inputs, seqs, table, s_in, initial_states, output, final_states,
///    saved)`:
///    `s_in [H,K,V]` fp32 is the exact incoming state of local sequence 0 from earlier shards (all
///    zeros when that sequence starts here). `initial_states [N,H,K,V]` (empty view when not
///    given) applies to every local sequence that starts here (`seqs.starts_here(i)`), i.e. the
///    state entering sequence 0 is `s_in + (starts_here(0) ? h0[ordinal] : 0)`. Writes
///    `output [T,H,V]` and, when `final_states` is non-empty, the rows of the local sequences that
///    end here (`seqs.ends_here(i)`). Keeps in `saved` what backward needs.
/// 3. `backward_prepare(space, saved, output_grad, seqs, table, SummaryViews summary)`: write the
///    backward summary `(Mᵀ, γ)` of the **leading fragment** (local sequence 0):
///    `γ = ∂L_local/∂S_in` with zero gradient arriving at that fragment's end and without that
///    sequence's own final-state gradient (the driver folds it in).
/// 4. `backward_apply(space, saved, output_grad, seqs, table, ds_out, final_state_grads, grads,
///    initial_state_grads, ds_in)`: `ds_out [H,K,V]` fp32 is the exact gradient arriving at the end
///    of local sequence `n-1` from later shards (zeros when it ends here);
///    `final_state_grads [N,H,K,V]` (empty when not given) applies to every local sequence that
///    ends here. Writes every gradient in `grads`, the `initial_state_grads` rows of the local
///    sequences that start here (when non-empty), and `ds_in [H,K,V]` = the gradient w.r.t. the
///    state entering local sequence 0 (when non-empty).
///
/// ### Optional: what the driver will use (`SummaryNeeds`)
///
/// A backend may also accept a trailing `const SummaryNeeds&` in both prepare methods
/// (`forward_prepare(space, inputs, seqs, table, summary, saved, needs)`, `backward_prepare(space,
/// saved, output_grad, seqs, table, summary, needs)`); the driver then passes, per call, which
/// parts of the summary a later composition reads and whether the apply's boundary state will be
/// zero. Derived from the plan alone (every rank agrees without communicating):
/// - `state`: the summary state (`dS` / `γ`) is read: the trailing (leading) sequence continues
///   to a later (earlier) shard;
/// - `transition`: `M` (`Mᵀ`) is read with a possibly non-zero operand: `state` holds and the
///   fragment's incoming state (outgoing gradient) can be non-zero — it continues a sequence
///   from another shard, or the user gave initial states (final-state gradients);
/// - `zero_boundary`: the apply's `s_in` (`ds_out`) will be all zeros and no user boundary
///   value is given, so every local sequence starts (ends) from zero and the apply's result does
///   not depend on the composition — a backend may compute it already in the prepare method.
/// The driver's summary records arrive zeroed; a part not needed may be left untouched and then
/// travels as zeros (the byte counts never change). `M = 0` is also the exact transition of a
/// fragment whose incoming state is zero, so compositions stay exact. A backend without this
/// overload is called with the five-argument form and must write the whole summary.
///
/// Initial states and final-state gradients of sequences that *continue* across shards are folded
/// in by the driver (they travel inside the composed `s_in` / `ds_out`); the shard where such a
/// sequence starts (ends) applies them itself, so activations in fp64 keep fp64 states locally.
/// Every user-facing state view (`initial_states`, `final_states` and their gradients) uses the
/// activation scalar type; summaries, `s_in`, `ds_out` and `ds_in` are fp32.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "ctxpar/chunkwise/local_sequences.hpp"
#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/chunkwise/transition.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/core/impl/detect.hpp"
#include "ctxpar/core/impl/enum_name.hpp"
#include "ctxpar/core/impl/team_mma_product.hpp"
#include "ctxpar/core/storage.hpp"

namespace ctxpar::chunkwise {

/// The sizes a backend reports for its inputs.
struct ChunkwiseShape {
  std::int64_t tokens = 0;     ///< `T` (local tokens)
  std::int64_t heads = 0;      ///< `H`
  std::int64_t key_dim = 0;    ///< `K`
  std::int64_t value_dim = 0;  ///< `V`
};

/// Which parts of one prepare call's summary the driver will read, and whether the matching
/// apply starts from zero (see "Optional: what the driver will use" above). The defaults ask for
/// everything, the behaviour of a backend without the overload.
struct SummaryNeeds {
  bool state = true;           ///< the summary state (`dS` / `γ`) is read by a composition
  bool transition = true;      ///< `M` / `Mᵀ` is read with a possibly non-zero operand
  bool zero_boundary = false;  ///< the apply's `s_in` / `ds_out` is zero, no user boundary value
};

/// The per-slot table of a backend that needs none (`table_type`).
struct NoTable {};

/// How the per-chunk products of the chunkwise families multiply: the type their operands are
/// read as. `exact` is fp32 FMA (and the only choice for fp64); `tf32`, `bfloat16` and `float16`
/// run the products on tensor cores (`core/impl/team_mma_product.hpp`) with the operands
/// rounded to that type and fp32 accumulation: `mma.sync` on CUDA built for sm_80 or later, MFMA
/// on HIP built for gfx908, gfx90a or gfx94x (where `tf32` rounds its operands to TF32 and
/// multiplies them in fp32 MFMA: the same values), an emulation of either on the host spaces (for
/// testing, not speed). A 16-bit plan's inputs are exact in
/// their own type, so `bfloat16` (`float16`) rounds only the intermediate operands of such a
/// plan. These are every team product of the kernels (`chunk_product`). In the gated delta
/// families: the intra-chunk products (`K·Kᵀ`, `Q·Kᵀ`, `X·(βΓK)`, `X·(βV)`), the state passes'
/// (`W̃·S`, `Q̂·S`, `P·U`, `K̃ᵀ·U` forward; `K̃·D`, `Pᵀ·dO`, `Q̂ᵀ·dO`, `W̃ᵀ·dU` reverse; the
/// carried state stays fp32) and the eleven of the per-chunk gradients. In the decay families:
/// the chunk updates `K̃ᵀ·V`, the scores and outputs (`Q·Kᵀ`, `P·V`, `Q̂·S`) and the gradient
/// tiles' products; their chains across chunks are elementwise and stay fp32. The triangular
/// solve, the summaries and their composition stay exact. `float16` operands have float16's
/// range: a value past 65504 becomes infinite and one below 2⁻¹⁴ loses bits, which the bounds
/// (`products_roundoff_factor`) do not cover; `bfloat16` and `tf32` have fp32's range.
///
/// `automatic` (the default) is the storage type's own products for a 16-bit plan on a device
/// with tensor cores, and `exact` everywhere else: fp32 and fp64 data and the host spaces
/// (`resolve_chunk_products`).
enum class ChunkProducts { exact, tf32, bfloat16, float16, automatic };

/// `"exact"`, `"tf32"`, `"bfloat16"`, `"float16"` or `"automatic"`.
inline const char* to_string(ChunkProducts products) {
  static constexpr const char* names[] = {"exact", "tf32", "bfloat16", "float16", "automatic"};
  return ctxpar::impl::enum_name(products, names, "unknown");
}

/// The products `requested` means for a plan on storage type `Storage` whose family has
/// tensor-core chunk products (`family_has_them`), where `tensor_cores` tells whether its space
/// runs 16-bit data on them by default: `automatic` becomes `bfloat16` for bfloat16 storage and
/// `float16` for float16 storage when both hold, `exact` otherwise; any other choice stays itself.
template <class Storage>
constexpr ChunkProducts resolve_chunk_products(ChunkProducts requested, bool tensor_cores,
                                               bool family_has_them = true) {
  if (requested != ChunkProducts::automatic) return requested;
  if (!tensor_cores || !family_has_them) return ChunkProducts::exact;
  if constexpr (std::is_same_v<Storage, ctxpar::bfloat16>)
    return ChunkProducts::bfloat16;
  else if constexpr (std::is_same_v<Storage, ctxpar::float16>)
    return ChunkProducts::float16;
  else
    return ChunkProducts::exact;
}

/// `resolve_chunk_products<Storage>` on `ExecutionSpace` (`team_mma_by_default_v`): what a
/// plan of that space and storage type multiplies with; the tests' and tools' bounds use it.
template <class ExecutionSpace, class Storage>
constexpr ChunkProducts resolve_chunk_products(ChunkProducts requested,
                                               bool family_has_them = true) {
  return resolve_chunk_products<Storage>(
      requested, ctxpar::impl::team_mma_by_default_v<ExecutionSpace>, family_has_them);
}

namespace impl {
template <class Backend>
using tensor_core_products_t = decltype(Backend::has_tensor_core_products);
template <class Backend>
constexpr bool declares_tensor_core_products() {
  if constexpr (ctxpar::impl::is_detected<tensor_core_products_t, Backend>::value)
    return Backend::has_tensor_core_products;
  else
    return false;
}
}  // namespace impl

/// True for a backend whose family can multiply its chunk products on tensor cores (it declares
/// `static constexpr bool has_tensor_core_products = true`: every family of this library; a
/// user's backend that does not declare it multiplies as it does).
template <class Backend>
inline constexpr bool has_tensor_core_products_v = impl::declares_tensor_core_products<Backend>();

/// The chunk products a plan on `ExecutionSpace` built with `backend` multiplies with: its
/// options' choice resolved for the space, its storage type and its family.
template <class ExecutionSpace, class Backend>
ChunkProducts chunk_products_of(const Backend& backend) {
  return resolve_chunk_products<ExecutionSpace, typename Backend::scalar_type>(
      backend.options().products, has_tensor_core_products_v<Backend>);
}

/// The most chunks one sequence's state passes carry a rounding through, on all ranks together:
/// the chunks of its `length` tokens (`chunk` each) plus one for each of the `pieces − 1` places
/// where the ranks' shards cut it (a piece starts a new chunk). The chain of
/// `products_roundoff_factor`.
constexpr std::int64_t chained_chunks(std::int64_t length, std::int64_t chunk,
                                      std::int64_t pieces) {
  return length <= 0 ? 0 : (length + chunk - 1) / chunk + (pieces > 1 ? pieces - 1 : 0);
}

/// The chain of `products_roundoff_factor` where the state decays: a rounding carried through a
/// chunk shrinks by the chunk's transition, whose norm is at most its whole decay `exp(γ_last)`
/// (unit-norm keys and β in [0, 2] make every `I − β k kᵀ` factor at most 1 in norm). Where every
/// whole chunk decays by at least `decay` < 1 and at most `partial` chunks of the chain are not
/// whole, a rounding persists through at most `(partial + 1)/(1 − decay)` chunks in all (a
/// geometric series between consecutive partial chunks), and never through more than `chunks`.
inline double decayed_chain(double chunks, double decay, double partial) {
  if (!(decay < 1)) return chunks;
  const double bound = (partial + 1) / (1 - decay);
  return bound < chunks ? bound : chunks;
}

/// How many unit roundoffs of the chunk products (`products_unit_roundoff`) a result can move by,
/// relative and to first order, from the exact products' result, where the state passes carry a
/// rounding through at most `chain` chunks (`chained_chunks`, `decayed_chain`). Every
/// tensor-core product rounds its two operands once.
/// - Forward, 12 + 4·chain: the four intra-chunk products (`K·Kᵀ`, `Q̂·Kᵀ`, `X·(βΓK)`, `X·(βV)`)
///   give 8. In the forward state pass each chunk's `U = Ũ − W̃·S` rounds `W̃` and `S` (2) and
///   the next state `Γ·S + K̃ᵀ·U` rounds `K̃` and `U` (2 more): 4 per chunk carried in the state (and
///   in `M`). A chunk's output `Q̂·S + P·U` rounds its operands once more: 4.
/// - Backward, 40 + 8·chain: the four forward and four gradient products (`Xᵀ·dU`, `dY·Uᵀ`,
///   `dA·K`, …, `ChunkGradients`) counted at the backward's factor 2 as the fp32 bounds are, 32;
///   the saved `S` and `U` of the forward pass, 4 + 4·chain; and the reverse pass, whose
///   `dU = K̃·D + Pᵀ·dO` and the next `Γ·D + Q̂ᵀ·dO − W̃ᵀ·dU` carry 4 per chunk with 4 at the end.
/// A worst case: every rounding in one direction. Measured errors sit far below it (the
/// chunkwise guide has figures). The tests and the command line's check add `factor·u_p` to the
/// fp32 bound.
constexpr double products_roundoff_factor(bool backward, double chain) {
  return backward ? 40.0 + 8.0 * chain : 12.0 + 4.0 * chain;
}

/// How many unit roundoffs of the chunk products a result of a decay family (scalar decay,
/// diagonal gates) can move by, relative to the sum of the magnitudes of its terms: the
/// componentwise kind of bound those families have, to first order. Every term is a product of at
/// most four rounded operands. An output's `(Q·Kᵀ ⊙ decay)·V` rounds q and k, then the scores and
/// v; its `Q̂·S` rounds q̂ and S, whose chunk updates `K̃ᵀ·V` rounded k̃ and v. The gradients'
/// products reach four the same way (`D = dO·Vᵀ`, then `D·K` or `Dᵀ·Q'`; `dO·Sᵀ`; `Pᵀ·dO`), and
/// `dg`'s terms multiply two such results. The chain across chunks only adds decayed terms in fp32:
/// no transition mixes their signs as the gated delta rule's does, so its length does not enter.
inline constexpr double decay_products_roundoff_factor = 4.0;

/// The unit roundoff of the operands of chunk products `products` (resolved: not `automatic`):
/// 0 for `exact` (fp32, whose own roundoff every bound counts already), 2⁻¹¹ for TF32 and float16
/// (10 fraction bits), 2⁻⁸ for bfloat16 (7).
inline double products_unit_roundoff(ChunkProducts products) {
  switch (products) {
    case ChunkProducts::tf32:
    case ChunkProducts::float16:
      return 1.0 / 2048;
    case ChunkProducts::bfloat16:
      return 1.0 / 256;
    default:
      return 0.0;
  }
}

/// Options every backend accepts.
struct BackendOptions {
  int chunk_size = 64;  ///< tokens per chunk of the local chunkwise algorithm
  double scale = 0.0;   ///< output scale; 0 selects `K^(-1/2)`
  /// How the per-chunk products multiply (`ChunkProducts`; every rank must pass the same).
  ChunkProducts products = ChunkProducts::automatic;
};

namespace impl {

/// The one check of a chunk size (`name` is how the caller's options spell it), made where a plan
/// is built: the backends and engines a plan owns take their chunk size as given.
inline void require_chunk_size(Preconditions& chk, std::int64_t chunk_size,
                               const std::string& name) {
  chk.require(chunk_size >= 1, name + " must be positive", ">= 1", chunk_size);
}

/// The one check that tensor-core chunk products are asked of a backend whose data they multiply:
/// fp32 (a 16-bit plan's backend is fp32); an fp64 backend multiplies exactly.
template <class Scalar>
void require_products_for_data(Preconditions& chk, ChunkProducts products) {
  chk.require(products == ChunkProducts::exact || products == ChunkProducts::automatic ||
                  sizeof(Scalar) <= 4,
              "tensor-core chunk products (options.products) need float or 16-bit data",
              "exact or automatic for double", to_string(products));
}

}  // namespace impl

/// Token-major activation view `[T, H, D]`.
template <class Scalar, class MemorySpace>
using token_view = Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>;
/// Read-only token-major activation view `[T, H, D]`.
template <class Scalar, class MemorySpace>
using const_token_view = Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>;
/// Per-token, per-head values `[T, H]` (scalar gates, `β`).
template <class Scalar, class MemorySpace>
using head_view = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;
/// Read-only `[T, H]`.
template <class Scalar, class MemorySpace>
using const_head_view = Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>;
/// One fp32 state per head `[H, K, V]` (`S_in`, `dS_out`, `dS_in`).
template <class MemorySpace>
using state_view = Kokkos::View<float***, Kokkos::LayoutRight, MemorySpace>;
/// Read-only `[H, K, V]` fp32.
template <class MemorySpace>
using const_state_view = Kokkos::View<const float***, Kokkos::LayoutRight, MemorySpace>;
/// Per-sequence states `[N, H, K, V]` in the activation type (initial/final states, gradients).
template <class Scalar, class MemorySpace>
using sequence_states_view = Kokkos::View<Scalar****, Kokkos::LayoutRight, MemorySpace>;
/// Read-only `[N, H, K, V]`.
template <class Scalar, class MemorySpace>
using const_sequence_states_view = Kokkos::View<const Scalar****, Kokkos::LayoutRight, MemorySpace>;

/// Whether an optional view argument was given (a default-constructed view means "not given").
template <class View>
bool is_given(const View& view) {
  return view.data() != nullptr;
}

/// The chunk length the local kernels use: `chunk_size` clamped to the shard's `tokens` (at least
/// 1). A chunk longer than the shard holds the same tokens as one of exactly the shard's length
/// (chunks never cross a sequence start), so the result is unchanged, but the per-chunk tiles
/// (`chunk²` elements each) are sized by what is there instead of by a huge option.
inline int effective_chunk(int chunk_size, std::int64_t tokens) {
  const std::int64_t cap = tokens < 1 ? 1 : tokens;
  return static_cast<int>(chunk_size < cap ? chunk_size : cap);
}

/// Resolves the `scale` option: `K^(-1/2)` when it is 0.
inline double resolve_scale(double scale, std::int64_t key_dim) {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(key_dim > 0 ? key_dim : 1));
}

namespace impl {

template <class...>
using void_t = void;

template <class B, class = void>
struct has_backend_types : std::false_type {};
template <class B>
struct has_backend_types<
    B, void_t<typename B::scalar_type, typename B::memory_space, typename B::transition_type,
              typename B::inputs_type, typename B::gradients_type, typename B::saved_type,
              typename B::table_type>> : std::true_type {};

template <class B, class = void>
struct has_plan_queries : std::false_type {};
template <class B>
struct has_plan_queries<
    B,
    void_t<decltype(B::family_name), decltype(B::family_id),
           decltype(std::declval<const B&>().chunk_size()),
           decltype(std::declval<const B&>().shape(std::declval<const typename B::inputs_type&>())),
           decltype(std::declval<const B&>().check(std::declval<Preconditions&>(),
                                                   std::declval<const typename B::inputs_type&>())),
           decltype(std::declval<const B&>().check_gradients(
               std::declval<Preconditions&>(), std::declval<const typename B::inputs_type&>(),
               std::declval<const typename B::gradients_type&>())),
           decltype(std::declval<const B&>().slice(std::declval<const typename B::inputs_type&>(),
                                                   std::int64_t{}, std::int64_t{})),
           decltype(std::declval<const B&>().slice(
               std::declval<const typename B::gradients_type&>(), std::int64_t{}, std::int64_t{})),
           decltype(std::declval<const B&>().make_table(std::declval<const LocalSequences&>(),
                                                        std::declval<const ChunkwiseShape&>()))>>
    : std::true_type {};

// The four contract methods, called with arguments of the given types.
template <class B, class... Args>
using forward_prepare_call =
    decltype(std::declval<const B&>().forward_prepare(std::declval<Args>()...));
template <class B, class... Args>
using forward_apply_call =
    decltype(std::declval<const B&>().forward_apply(std::declval<Args>()...));
template <class B, class... Args>
using backward_prepare_call =
    decltype(std::declval<const B&>().backward_prepare(std::declval<Args>()...));
template <class B, class... Args>
using backward_apply_call =
    decltype(std::declval<const B&>().backward_apply(std::declval<Args>()...));

/// The argument types of backend `B`'s contract methods on `ExecutionSpace`, named as in the
/// diagnostics of `check_chunkwise_backend`, and which of the methods `B` accepts them in.
template <class B, class ExecutionSpace>
struct ContractMethods {
  using scalar = typename B::scalar_type;
  using memory = typename B::memory_space;
  using space = const ExecutionSpace&;
  using inputs = const typename B::inputs_type&;
  using seqs = const LocalSequences&;
  using table = const typename B::table_type&;
  using summary = const SummaryViews<memory>&;
  using saved = typename B::saved_type&;
  using needs = const SummaryNeeds&;
  using output = const token_view<scalar, memory>&;
  using output_grad = const const_token_view<scalar, memory>&;
  using grads = const typename B::gradients_type&;
  using s_in = const const_state_view<memory>&;
  using ds_in = const state_view<memory>&;
  using given_states = const const_sequence_states_view<scalar, memory>&;
  using written_states = const sequence_states_view<scalar, memory>&;

  /// True when `B` has the contract method `Call` taking the space and then `Args`.
  template <template <class...> class Call, class... Args>
  static constexpr bool accepts = ctxpar::impl::is_detected<Call, B, space, Args...>::value;

  static constexpr bool forward_prepare =
      accepts<forward_prepare_call, inputs, seqs, table, summary, saved>;
  /// The optional overload told which summary parts the composition reads.
  static constexpr bool forward_prepare_needs =
      accepts<forward_prepare_call, inputs, seqs, table, summary, saved, needs>;
  static constexpr bool forward_apply = accepts<forward_apply_call, inputs, seqs, table, s_in,
                                                given_states, output, written_states, saved>;
  static constexpr bool backward_prepare =
      accepts<backward_prepare_call, saved, output_grad, seqs, table, summary>;
  /// The optional overload told which summary parts the composition reads.
  static constexpr bool backward_prepare_needs =
      accepts<backward_prepare_call, saved, output_grad, seqs, table, summary, needs>;
  static constexpr bool backward_apply =
      accepts<backward_apply_call, saved, output_grad, seqs, table, s_in, given_states, grads,
              written_states, ds_in>;
};

// The two optional overloads, which the driver calls when they exist.
template <class B, class E>
using has_forward_prepare_needs = std::bool_constant<ContractMethods<B, E>::forward_prepare_needs>;
template <class B, class E>
using has_backward_prepare_needs =
    std::bool_constant<ContractMethods<B, E>::backward_prepare_needs>;

}  // namespace impl

namespace impl {
template <class Backend, class ExecutionSpace, bool HasTypes = has_backend_types<Backend>::value>
struct backend_check : std::false_type {};
template <class Backend, class ExecutionSpace>
struct backend_check<Backend, ExecutionSpace, true> {
  using methods = ContractMethods<Backend, ExecutionSpace>;
  static constexpr bool value = is_transition_v<typename Backend::transition_type> &&
                                has_plan_queries<Backend>::value && methods::forward_prepare &&
                                methods::forward_apply && methods::backward_prepare &&
                                methods::backward_apply;
};
}  // namespace impl

/// True when `Backend` satisfies the chunkwise backend contract for `ExecutionSpace`.
template <class Backend, class ExecutionSpace>
inline constexpr bool is_chunkwise_backend_v = impl::backend_check<Backend, ExecutionSpace>::value;

/// Static checker of the contract with one readable diagnostic per missing piece; call it as
/// `static_assert(check_chunkwise_backend<B, Exec>())`.
template <class Backend, class ExecutionSpace>
constexpr bool check_chunkwise_backend() {
  static_assert(impl::has_backend_types<Backend>::value,
                "ctxpar::chunkwise backend: needs the nested types scalar_type, memory_space, "
                "transition_type, inputs_type, gradients_type, saved_type and table_type");
  if constexpr (impl::has_backend_types<Backend>::value) {
    using methods = impl::ContractMethods<Backend, ExecutionSpace>;
    static_assert(is_transition_v<typename Backend::transition_type>,
                  "ctxpar::chunkwise backend: transition_type must be a transition tag");
    static_assert(impl::has_plan_queries<Backend>::value,
                  "ctxpar::chunkwise backend: needs family_name, family_id, chunk_size(), shape(), "
                  "check(), check_gradients(), slice() for inputs and gradients and "
                  "make_table()");
    static_assert(
        methods::forward_prepare,
        "ctxpar::chunkwise backend: forward_prepare(space, inputs, seqs, table, summary, saved) "
        "is missing or has the wrong signature");
    static_assert(methods::forward_apply,
                  "ctxpar::chunkwise backend: forward_apply(space, inputs, seqs, table, s_in, "
                  "initial_states, output, final_states, saved) is missing or has the wrong "
                  "signature");
    static_assert(methods::backward_prepare,
                  "ctxpar::chunkwise backend: backward_prepare(space, saved, output_grad, seqs, "
                  "table, summary) is missing or has the wrong signature");
    static_assert(
        methods::backward_apply,
        "ctxpar::chunkwise backend: backward_apply(space, saved, output_grad, seqs, "
        "table, ds_out, final_state_grads, grads, initial_state_grads, ds_in) is missing or has "
        "the wrong signature");
  }
  return is_chunkwise_backend_v<Backend, ExecutionSpace>;
}

}  // namespace ctxpar::chunkwise
