/// \file
/// Mechanism B of ctxpar, chunkwise linear attention and SSMs under context parallelism (scalar
/// decay, diagonal gates, gated delta rule and product; packed sequences; the short
/// convolution): everything public in one include.
#pragma once

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/compose.hpp"
#include "ctxpar/chunkwise/diagonal_gate.hpp"
#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/gated_delta_product.hpp"
#include "ctxpar/chunkwise/gated_delta_rule.hpp"
#include "ctxpar/chunkwise/local_sequences.hpp"
#include "ctxpar/chunkwise/policy.hpp"
#include "ctxpar/chunkwise/scalar_decay.hpp"
#include "ctxpar/chunkwise/sequence_layout.hpp"
#include "ctxpar/chunkwise/short_conv.hpp"
#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/chunkwise/transition.hpp"
