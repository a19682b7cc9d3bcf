// Names, parsers and value lists of the enums of enums.h (host only: NVRTC compiles enums.h
// alone). What `_core.enums()` exports to Python, and what every C++ switch over these enums
// falls back to: unknown values throw std::invalid_argument naming the value.
#pragma once

#include <stdexcept>
#include <string>

#include "kernels/common/enums.h"

namespace sparsejit {

// Every value of each enum, in numbering order (what `_core.enums()` exports).
inline constexpr ScalarKind kAllScalarKinds[] = {ScalarKind::F32, ScalarKind::F64,
                                                 ScalarKind::BF16, ScalarKind::F16};
inline constexpr IndexKind kAllIndexKinds[] = {IndexKind::I32, IndexKind::I64};
inline constexpr Reduce kAllReduces[] = {Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::Min};
inline constexpr Act kAllActs[] = {Act::None, Act::Relu, Act::LeakyRelu, Act::Elu, Act::Gelu,
                                   Act::Runtime};
inline constexpr OpKind kAllOpKinds[] = {
    OpKind::Spmm,        OpKind::Sddmm,         OpKind::Rgms,
    OpKind::PointConv,   OpKind::FilterConv,    OpKind::Attention,
    OpKind::EdgeSoftmax, OpKind::EdgeSoftmaxBackward, OpKind::AttentionBackward,
    OpKind::PointConvMap, OpKind::PointConvImplicit};
// The families whose plans are tensors with the common header (plan_header.h).
inline constexpr OpKind kPlanOpKinds[] = {OpKind::Spmm, OpKind::Sddmm, OpKind::Rgms,
                                          OpKind::PointConv, OpKind::FilterConv};

namespace detail {
[[noreturn]] inline void bad_enum(const char* what, int value) {
  throw std::invalid_argument(std::string("sparsejit: unknown ") + what + " value " +
                              std::to_string(value));
}
}  // namespace detail

// Short names: f32 f64 bf16 f16 / i32 i64 / sum mean max min / none relu leaky_relu elu gelu
// runtime / spmm sddmm rgms point_conv filter_conv attention edge_softmax edge_softmax_backward
// attention_backward point_conv_map point_conv_implicit. Unknown values throw
// std::invalid_argument naming the value.
inline const char* scalar_name(ScalarKind k) {
  switch (k) {
    case ScalarKind::F32: return "f32";
    case ScalarKind::F64: return "f64";
    case ScalarKind::BF16: return "bf16";
    case ScalarKind::F16: return "f16";
    default: detail::bad_enum("scalar kind", static_cast<int>(k));
  }
}

inline const char* index_name(IndexKind k) {
  switch (k) {
    case IndexKind::I32: return "i32";
    case IndexKind::I64: return "i64";
    default: detail::bad_enum("index kind", static_cast<int>(k));
  }
}

inline const char* reduce_name(Reduce r) {
  switch (r) {
    case Reduce::Sum: return "sum";
    case Reduce::Mean: return "mean";
    case Reduce::Max: return "max";
    case Reduce::Min: return "min";
    default: detail::bad_enum("reduce", static_cast<int>(r));
  }
}

inline const char* act_name(Act a) {
  switch (a) {
    case Act::None: return "none";
    case Act::Relu: return "relu";
    case Act::LeakyRelu: return "leaky_relu";
    case Act::Elu: return "elu";
    case Act::Gelu: return "gelu";
    case Act::Runtime: return "runtime";
    default: detail::bad_enum("activation", static_cast<int>(a));
  }
}

inline const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::Spmm: return "spmm";
    case OpKind::Sddmm: return "sddmm";
    case OpKind::EdgeSoftmax: return "edge_softmax";
    case OpKind::EdgeSoftmaxBackward: return "edge_softmax_backward";
    case OpKind::Rgms: return "rgms";
    case OpKind::PointConv: return "point_conv";
    case OpKind::FilterConv: return "filter_conv";
    case OpKind::Attention: return "attention";
    case OpKind::AttentionBackward: return "attention_backward";
    case OpKind::PointConvMap: return "point_conv_map";
    case OpKind::PointConvImplicit: return "point_conv_implicit";
    default: detail::bad_enum("op kind", static_cast<int>(op));
  }
}

// Bytes of one element.
inline int scalar_bytes(ScalarKind k) {
  switch (k) {
    case ScalarKind::F32: return 4;
    case ScalarKind::F64: return 8;
    case ScalarKind::BF16: return 2;
    case ScalarKind::F16: return 2;
    default: detail::bad_enum("scalar kind", static_cast<int>(k));
  }
}

inline Reduce parse_reduce(const std::string& s) {
  if (s == "add") return Reduce::Sum;
  for (Reduce r : kAllReduces)
    if (s == reduce_name(r)) return r;
  throw std::invalid_argument("reduce must be one of 'sum', 'mean', 'max', 'min'; got '" + s + "'");
}

// A user-facing activation name ("" means none); "runtime" is not one.
inline Act parse_activation(const std::string& s) {
  if (s.empty()) return Act::None;
  for (Act a : kAllActs)
    if (a != Act::Runtime && s == act_name(a)) return a;
  std::string names;
  for (Act a : kAllActs) {
    if (a == Act::Runtime) continue;
    names += names.empty() ? "" : ", ";
    names += act_name(a);
  }
  throw std::invalid_argument("activation must be one of " + names + "; got '" + s + "'");
}

}  // namespace sparsejit
