// The one family of check macros (STYLE.md 1-2). What input, files, peers or the device can
// break returns absl::Status; CHECK-style invariants use MQA_CHECK and abort with a message.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define MQA_STATUS_CONCAT_INNER(a, b) a##b
#define MQA_STATUS_CONCAT(a, b) MQA_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status mqa_status_ = (expr);               \
    if (!mqa_status_.ok()) return mqa_status_;         \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()); declares/assigns `lhs` or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  MQA_ASSIGN_OR_RETURN_IMPL(MQA_STATUS_CONCAT(mqa_statusor_, __LINE__), lhs, expr)
#define MQA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

// Internal invariants: a broken one is a bug in mqaserve, not bad input.
#define MQA_CHECK(cond)                                                                 \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);     \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

#define MQA_CHECK_OK(expr)                                                              \
  do {                                                                                  \
    ::absl::Status mqa_status_ = (expr);                                                \
    if (!mqa_status_.ok()) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                \
                   mqa_status_.ToString().c_str());                                     \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

// MPI: turns a failing MPI call into a Status naming the call and its place.
#define MPI_RETURN_IF_ERROR(expr)                                                        \
  do {                                                                                   \
    int mqa_mpi_rc_ = (expr);                                                            \
    if (mqa_mpi_rc_ != 0 /* MPI_SUCCESS */) {                                           \
      return ::absl::InternalError(                                                      \
          ::absl::StrCat(#expr, " failed with MPI error ", mqa_mpi_rc_, " at ", __FILE__, \
                         ":", __LINE__));                                                \
    }                                                                                    \
  } while (0)
