/// \file
/// The expression-template layer: element-wise view expressions (and the small batched
/// contraction, concatenation and flattening of the summary algebra) with explicit
/// `ctxpar::assign`, and attention mask expressions.
#pragma once

#include "ctxpar/expr/assign.hpp"
#include "ctxpar/expr/binary.hpp"
#include "ctxpar/expr/broadcast.hpp"
#include "ctxpar/expr/concat.hpp"
#include "ctxpar/expr/contraction.hpp"
#include "ctxpar/expr/expression.hpp"
#include "ctxpar/expr/flatten.hpp"
#include "ctxpar/expr/leaf.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/expr/unary.hpp"
