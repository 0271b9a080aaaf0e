/// \file
/// Mechanism A of ctxpar, sliding-window attention with a streaming carried cache and context
/// parallelism over the key/value axis: everything public in one include.
#pragma once

#include "ctxpar/swa/attention_kernel.hpp"
#include "ctxpar/swa/cache.hpp"
#include "ctxpar/swa/distributed_step.hpp"
#include "ctxpar/swa/document_mask.hpp"
#include "ctxpar/swa/gradients.hpp"
#include "ctxpar/swa/options.hpp"
#include "ctxpar/swa/policies.hpp"
#include "ctxpar/swa/rope.hpp"
#include "ctxpar/swa/tensors.hpp"
