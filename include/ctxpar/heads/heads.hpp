/// \file
/// Mechanism C of ctxpar, head partitioning for Gated DeltaNet / Gated Delta Product layers
/// (sequence-sharded to head-sharded and back, the context-parallel GDP layer): everything public
/// in one include. The layer core it runs is internal (`impl/gdp_layer_core.hpp`).
#pragma once

#include "ctxpar/heads/channel_layout.hpp"
#include "ctxpar/heads/gdp_context_parallel.hpp"
#include "ctxpar/heads/policies.hpp"
#include "ctxpar/heads/skip_term.hpp"
#include "ctxpar/heads/transpose_plan.hpp"
