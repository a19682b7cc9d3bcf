// The op-agnostic face of a JIT-compiled CPU kernel: a spec (op, dtype, index type, the op's
// parameters) gives its name, its C++ source and its in-memory key through one interface, and
// every generated function has one calling convention,
//
//   extern "C" void sparsejit_entry(const void* launch);
//
// where `launch` points at the op's launch struct (kernels/cpu/<op>_args.h, e.g.
// cpu::SpmmLaunch). CpuJit (cpu_jit.h) compiles, caches and loads any spec without knowing
// its op, so a new op family adds a spec class and a launch struct and touches nothing there.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/common/enum_names.h"

namespace sparsejit::codegen {

// The enums are numbered once, in kernels/common/enums.h.
using sparsejit::Act;
using sparsejit::IndexKind;
using sparsejit::OpKind;
using sparsejit::ScalarKind;

// The one signature of generated entry points (symbol kEntrySymbol).
using EntryFn = void (*)(const void* launch);
inline constexpr const char* kEntrySymbol = "sparsejit_entry";

class KernelSpecBase {
 public:
  virtual ~KernelSpecBase() = default;

  virtual OpKind op() const = 0;
  // Readable and unique among all specs, also the cache file prefix (spmm_f32_i32_sum_...).
  virtual std::string name() const = 0;
  // The full C++ source, defining sparsejit_entry for the op's launch struct.
  virtual std::string source() const = 0;
  // A 64-bit key for the per-call in-memory lookup (no strings on the hot path): unique among
  // the specs the planners emit, across ops (see pack()).
  virtual uint64_t packed_key() const = 0;

 protected:
  // The op in the top 6 bits; the op's parameters, which must fit in 58 bits, below.
  static uint64_t pack(OpKind op, uint64_t params) {
    return (static_cast<uint64_t>(op) & 0x3f) << 58 | (params & ((uint64_t(1) << 58) - 1));
  }
};

// C++ spellings for source emitters; unknown or unsupported values throw
// std::invalid_argument naming the value.
const char* cpp_scalar_type(ScalarKind k);  // float, double, sparsejit::bf16 (no f16 kernels)
const char* cpp_index_type(IndexKind k);    // int32_t, int64_t
std::string cpp_enum(Reduce r);             // sparsejit::Reduce::Sum
std::string cpp_enum(Act a);                // sparsejit::Act::Relu

}  // namespace sparsejit::codegen
