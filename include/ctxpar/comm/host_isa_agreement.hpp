/// \file
/// How a plan agrees on the instruction set of its host kernels (`core/host_isa.hpp`): inside the
/// plan's own precondition agreement, so it costs no collective of its own; `agreed_host_isa`
/// gives tools the same answer before they build a plan.
#pragma once

#include <string>

#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/core/host_isa.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"

namespace ctxpar::impl {

/// Records on `chk` what this rank asks for and the checks on it: a `CTXPAR_HOST_ISA` that names
/// an instruction set, a forced set this binary carries and this CPU runs, the same forced set (or
/// none) on every rank. After `chk.agree()`, `isa` is the narrowest set any rank asked for.
inline void agree_host_isa(Preconditions& chk, int& isa) {
  const HostIsaRequest request = requested_host_isa();
  chk.require(request.valid, "CTXPAR_HOST_ISA must name a host instruction set",
              "baseline, avx2, avx512 or auto", request.source);
  chk.require(!request.valid || host_isa_runs_here(request.isa),
              "the forced host instruction set must be compiled into this binary and run on this "
              "CPU",
              std::string("at most ") + host_isa_name(detected_host_isa()), request.source);
  chk.require_same("the forced host instruction set (-1: none)",
                   request.forced && request.valid ? static_cast<int>(request.isa) : -1);
  isa = static_cast<int>(request.isa);
  chk.take_lowest(&isa);
}

}  // namespace ctxpar::impl

namespace ctxpar {

/// The instruction set a plan built now over `group` would run its host kernels at (the same
/// agreement and the same errors), for tools and benchmarks that report it. Collective.
inline HostIsa agreed_host_isa(const Group& group,
                               const std::string& op = "ctxpar::agreed_host_isa") {
  Preconditions chk(group, op);
  int isa = 0;
  impl::agree_host_isa(chk, isa);
  chk.agree();
  return static_cast<HostIsa>(isa);
}

}  // namespace ctxpar
