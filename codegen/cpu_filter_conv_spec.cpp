#include "codegen/cpu_filter_conv_spec.h"

#include <cstdio>
#include <sstream>

namespace sparsejit::codegen {

namespace {

// FNV-1a over raw bytes (the baked spec's identity, and every spec's in-memory key).
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t pattern_hash(const CpuFilterConvSpec& s) {
  const int64_t head[5] = {s.vec, s.unroll, s.chunks, s.cout_g, s.group_stride};
  uint64_t h = fnv1a(head, sizeof(head));
  h = fnv1a(s.cp.data(), s.cp.size() * sizeof(int64_t), h);
  return fnv1a(s.off.data(), s.off.size() * sizeof(int32_t), h);
}

}  // namespace

std::string CpuFilterConvSpec::name() const {
  std::ostringstream os;
  if (baked) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(pattern_hash(*this)));
    os << "filter_conv_baked_v" << vec << "u" << unroll << "_" << hex;
  } else {
    os << "filter_conv_v" << vec << "u" << unroll << "_k" << chunks << "_g" << cout_g << "_s"
       << group_stride << (wide ? "" : "_narrow");
  }
  return os.str();
}

uint64_t CpuFilterConvSpec::packed_key() const {
  const std::string n = name();
  return pack(OpKind::FilterConv, fnv1a(n.data(), n.size()));
}

std::string CpuFilterConvSpec::source() const {
  const int64_t T = 8 * vec;
  std::ostringstream os;
  os << "// sparsejit generated kernel: " << name() << "\n"
     << "// Filter-sparse convolution, one output-channel block of one " << T
     << "-pixel tile; " << chunks << " input-channel chunk(s), " << cout_g
     << " output channels per group, group stride " << group_stride << ".\n"
     << "#define SPARSEJIT_ISA_NS jit_isa\n"
     << (baked || wide ? "" : "#define SPARSEJIT_FILTER_CONV_WIDE 0\n")
     << "#include \"kernels/cpu/filter_conv_tiles.h\"\n\n"
     << "using sparsejit::filter_conv::BlockLaunch;\n";
  if (!baked) {
    os << "extern \"C\" void sparsejit_entry(const void* launch) {\n"
       << "  sparsejit::filter_conv::jit_isa::run_block<" << vec << ", " << unroll << ", " << chunks
       << ", " << cout_g << ", " << group_stride << ">(\n"
       << "      *static_cast<const BlockLaunch*>(launch));\n}\n";
    return os.str();
  }
  // One function per non-empty (channel, chunk), replaying accumulate<V, U>'s operations on
  // named accumulators a<u>_<v> (plain SSA values: a struct of arrays costs GCC alias walks
  // quadratic in the function's length): tap e of the chunk goes to chain e % U while a full
  // group of U remains, the rest to chain 0, and the chains are summed in order at the end.
  const int64_t c_out = static_cast<int64_t>(cp.size()) / (chunks + 1);
  os << "using namespace sparsejit::filter_conv::jit_isa;\n"
     << "typedef void (*Fn)(const float* __restrict, const float* __restrict, float*);\n"
     << "static void zero(const float*, const float*, float* acc) {\n"
     << "  for (int q = 0; q < " << T << "; ++q) acc[q] = 0.0f;\n}\n";
  for (int u = 0; u < unroll; ++u) {  // TAP<u>(offset, weight index)
    os << "#define TAP" << u << "(o, i) { const float s = w[i];";
    for (int v = 0; v < vec; ++v)
      os << " a" << u << "_" << v << " = fma8(s, load8(x + (o) + " << 8 * v << "), a" << u
         << "_" << v << ");";
    os << " }\n";
  }
  std::ostringstream table;
  for (int64_t oc = 0; oc < c_out; ++oc) {
    const int64_t group_off = (oc / cout_g) * group_stride;
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t e0 = cp[oc * (chunks + 1) + k], e1 = cp[oc * (chunks + 1) + k + 1];
      if (e0 == e1) {
        table << (k == 0 ? "zero," : "nullptr,");
        continue;
      }
      os << "static void f" << oc << "_" << k
         << "(const float* __restrict x, const float* __restrict w, float* acc) {\n";
      for (int u = 0; u < unroll; ++u) {
        os << " ";
        for (int v = 0; v < vec; ++v) {
          os << " vf8 a" << u << "_" << v << " = ";
          if (u == 0 && k > 0) {
            os << "load8(acc + " << 8 * v << ");";
          } else {
            os << "vf8{};";
          }
        }
        os << "\n";
      }
      const int64_t n = e1 - e0, full = n - n % unroll;
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t u = e - e0 < full ? (e - e0) % unroll : 0;
        os << "  TAP" << u << "(" << group_off + off[e] << ", " << e << ")\n";
      }
      for (int v = 0; v < vec; ++v) {
        os << "  store8(acc + " << 8 * v << ", a0_" << v;
        for (int u = 1; u < unroll; ++u) os << " + a" << u << "_" << v;
        os << ");\n";
      }
      os << "}\n";
      table << "f" << oc << "_" << k << ",";
    }
    table << "\n";
  }
  os << "static const Fn kTable[] = {\n" << table.str() << "};\n\n"
     << "extern \"C\" void sparsejit_entry(const void* launch) {\n"
     << "  const BlockLaunch& L = *static_cast<const BlockLaunch*>(launch);\n"
     << "  for (int64_t k = 0; k < " << chunks << "; ++k)\n"
     << "    for (int64_t oc = L.oc0; oc < L.oc1; ++oc)\n"
     << "      if (const Fn f = kTable[oc * " << chunks << " + k])\n"
     << "        f(L.x, L.val, L.acc + (oc - L.oc0) * " << T << ");\n}\n";
  return os.str();
}

}  // namespace sparsejit::codegen
