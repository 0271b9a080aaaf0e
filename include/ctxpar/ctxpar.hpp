/// \file
/// Umbrella header: everything public in ctxpar.
#pragma once

#include "ctxpar/comm/comm.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/config.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
