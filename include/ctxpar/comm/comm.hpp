/// \file
/// The communication layer: `Group`, collective preconditions, and collectives on views.
#pragma once

#include "ctxpar/comm/allgather.hpp"
#include "ctxpar/comm/alltoall.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/host_isa_agreement.hpp"
#include "ctxpar/comm/posted_allgather.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/comm/reduce.hpp"
#include "ctxpar/comm/scan.hpp"
#include "ctxpar/comm/sendrecv.hpp"
