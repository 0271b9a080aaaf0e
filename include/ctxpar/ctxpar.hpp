/// \file
/// Umbrella header: everything public in ctxpar.
#pragma once

#include "ctxpar/comm/comm.hpp"
#include "ctxpar/core/allocation_counter.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/config.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/fingerprint.hpp"
#include "ctxpar/core/host_isa.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/expr/expr.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
#include "ctxpar/partition/head_partition.hpp"
#include "ctxpar/partition/packed_metadata.hpp"
#include "ctxpar/partition/zigzag.hpp"

// Mechanism A: sliding-window attention.
#include "ctxpar/swa/swa.hpp"

// Mechanism B: chunkwise linear attention / SSM.
#include "ctxpar/chunkwise/chunkwise.hpp"

// Mechanism C: head partitioning by all-to-all.
#include "ctxpar/heads/heads.hpp"
