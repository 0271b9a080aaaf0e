/// \file
/// Run-time options of the sliding-window attention step.
#pragma once

#include <cstdint>

#include "ctxpar/core/team_size.hpp"

namespace ctxpar::swa {

/// Which local attention kernels run. Every choice computes the same attention; the host SIMD and
/// the portable kernels (and the fused and two-kernel host backward) sum in different orders, so
/// their results may differ in the last bits, while each one alone keeps its bitwise guarantees.
/// Device spaces, and builds without the host SIMD kernels, run the portable kernels for every
/// choice but `tensor_core` (and `automatic` with 16-bit tensors on a device that has them).
enum class KernelChoice {
  /// The measured default: host spaces run the host SIMD kernels, with the fused backward where
  /// `impl::fused_backward_pays` says it is faster; device spaces run the portable kernels, and
  /// the tensor-core kernels for bfloat16 and float16 tensors where they have tensor cores.
  automatic,
  /// The portable team kernels (`impl/team_kernels.hpp`, shaped for GPUs) on every space.
  portable,
  /// The host SIMD kernels with the fused backward wherever the window allows it (`W > 0`).
  host_fused,
  /// The host SIMD kernels with the two-kernel backward (dQ in a kernel of its own).
  host_unfused,
  /// Forward and backward on tensor-core tile products (`impl/tensor_core_forward.hpp`,
  /// `impl/tensor_core_backward.hpp`): bfloat16 and float16 multiplied exactly, with fp32
  /// accumulation; float read as TF32 (10 fraction bits), only when asked for here. CUDA built
  /// for sm_80 or later runs the instructions, the host spaces an emulation of them (for testing,
  /// not speed); elsewhere, for double, or for head dimensions above 256 the step refuses it.
  tensor_core,
};

/// The default kernel choice: `portable` in a `CTXPAR_PORTABLE_KERNELS` build (the build knob),
/// `automatic` otherwise.
inline constexpr KernelChoice default_kernel_choice =
    CTXPAR_PORTABLE_KERNELS ? KernelChoice::portable : KernelChoice::automatic;

/// Options shared by the single-rank and the distributed step; every rank must pass the same.
struct Options {
  /// Window `W` in tokens: key `j` is visible to query `i` iff `pos_i - W < pos_j <= pos_i`
  /// (the query's own key counts). `0` means unlimited (plain causal).
  std::int64_t window = 0;
  /// RoPE base: pair `(d, d + D/2)` turns by `pos * base^(-2d/D)`.
  double rope_base = 10000.0;
  /// Softmax scale; `0` means `1 / sqrt(D)`.
  double scale = 0.0;
  /// When true, inputs are scanned for NaN/Inf (a collective check, one pass over the inputs).
  bool check_finite = false;
  /// Which local attention kernels run (`KernelChoice`).
  KernelChoice kernels = default_kernel_choice;
};

}  // namespace ctxpar::swa
