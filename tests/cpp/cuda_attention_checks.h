// Kernel-level checks of the fused attention's CUDA kernels (kernels/cuda/attention.cuh),
// included by cuda_kernel_checks.h: random q, k, v (bias, att, dropout where the spec has
// them) on the checks' graphs plus a one-entry one, poisoned outputs with guard bands, and a
// float64 reference of the forward (softmax over each row, out and lse) and of the backward
// (dq, dk, dv, dbias, GATv2's datt, from the same formulas as kernels/cpu/attention_kernel.h).
#pragma once

#include <cstdint>
#include <limits>

namespace sparsejit::codegen::checks {

// The CPU kernel's dropout draw (uniform01 + keep_factor of kernels/cpu/attention_kernel.h).
inline double ref_keep(uint64_t seed, double dropout, int64_t p, int64_t h, int64_t heads) {
  if (dropout <= 0) return 1;
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t(p) * uint64_t(heads) + uint64_t(h) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = double(z >> 11) * (1.0 / 9007199254740992.0);
  return u < dropout ? 0.0 : 1.0 / (1.0 - dropout);
}

template <typename I>
void check_attention(Runner& r, const CudaAttentionSpec& s) {
  const bool backward = s.backward;
  const int64_t H = s.heads, D = s.d, DV = s.dv;
  const int mode = s.mode;
  auto gs = graphs<I>();
  Csr<I> one;  // a single entry
  one.rows = 1;
  one.cols = 1;
  one.rowptr = {0, 1};
  one.col = {0};
  gs.push_back({"one_entry", one});
  int round = 0;
  for (auto& [gname, A] : gs) {
    SCOPED_TRACE(s.name() + " on " + gname);
    r.reset();
    const int64_t rows = A.rows, cols = A.cols, nnz = A.nnz();
    const double scale = mode == 0 ? 1.0 / std::sqrt(double(D)) : 1.0;
    const double slope = 0.2, dropout = (round++ % 2) ? 0.3 : 0.0;
    const uint64_t seed = 12345 + round;
    Buffer q(s.dtype, rows * H * D), k(s.dtype, cols * H * D), v(s.dtype, cols * H * DV);
    Buffer bias(s.dtype, s.has_bias ? nnz * H : 0), att(s.dtype, mode == 2 ? H * D : 0);
    fill_random(&q, 41, -1.5, 1.5);
    fill_random(&k, 42, -1.5, 1.5);
    fill_random(&v, 43);
    fill_random(&bias, 44);
    fill_random(&att, 45);
    if (s.has_bias)  // a masked entry (-inf bias) in the first row with two or more entries
      for (int64_t i = 0; i < rows; ++i)
        if (A.rowptr[i + 1] - A.rowptr[i] >= 2) {
          bias.set(int64_t(A.rowptr[i]) * H, -INFINITY);
          break;
        }
    // The float64 reference forward.
    auto score = [&](int64_t i, int64_t j, int64_t e, int64_t h) {
      double z = 0;
      for (int64_t d = 0; d < D; ++d) {
        const double qd = q.get((i * H + h) * D + d), kd = k.get((j * H + h) * D + d);
        if (mode == 0) z += qd * kd;
        if (mode == 2) {
          const double u = qd + kd;
          z += att.get(h * D + d) * (u < 0 ? u * slope : u);
        }
        if (mode == 1) z += qd + kd;
      }
      if (mode == 0) z *= scale;
      if (s.has_bias) z += bias.get(e * H + h);
      return z;
    };
    auto act = [&](double z) { return mode == 1 && z < 0 ? z * slope : z; };
    std::vector<double> ref_out(rows * H * DV, 0.0), ref_lse(rows * H, -INFINITY);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t h = 0; h < H; ++h) {
        double m = -INFINITY, l = 0;
        for (int64_t e = A.rowptr[i]; e < A.rowptr[i + 1]; ++e) {
          const double z = score(i, A.col[e], e, h);
          if (z != -INFINITY) m = std::max(m, act(z));
        }
        for (int64_t e = A.rowptr[i]; e < A.rowptr[i + 1]; ++e) {
          const double z = score(i, A.col[e], e, h);
          if (z == -INFINITY) continue;
          const double w = std::exp(act(z) - m);
          l += w;
          const double wk = w * ref_keep(seed, dropout, e, h, H);
          for (int64_t d = 0; d < DV; ++d)
            ref_out[(i * H + h) * DV + d] += wk * v.get((int64_t(A.col[e]) * H + h) * DV + d);
        }
        if (l > 0) {
          for (int64_t d = 0; d < DV; ++d) ref_out[(i * H + h) * DV + d] /= l;
          ref_lse[i * H + h] = m + std::log(l);
        }
      }
    DeviceCsr<I> dA(A, r);
    for (Buffer* b : {&q, &k, &v, &bias, &att}) b->upload(r);
    cuda::AttentionParams p{};
    p.rowptr = dA.rowptr.dev();
    p.col = dA.col.dev();
    p.q = q.dev();
    p.k = k.dev();
    p.v = v.dev();
    p.bias = s.has_bias ? bias.dev() : nullptr;
    p.att = mode == 2 ? att.dev() : nullptr;
    p.rows = rows;
    p.cols = cols;
    p.nnz = nnz;
    p.scale = scale;
    p.negative_slope = slope;
    p.dropout = dropout;
    p.seed = seed;
    const double tol = tolerance(s.dtype) * (1 + std::sqrt(double(std::max(D, DV))));
    auto expect_close = [&](const char* what, Buffer& got, const std::vector<double>& ref) {
      int bad = 0;
      for (int64_t t = 0; t < int64_t(ref.size()) && bad < 5; ++t) {
        const double g = got.get(t), want = ref[t];
        const bool same_inf = std::isinf(want) && g == want;
        if (!same_inf && !(std::abs(g - want) <= tol * (1 + std::abs(want)))) {
          ADD_FAILURE() << what << "[" << t << "] = " << g << ", expected " << want;
          ++bad;
        }
      }
      EXPECT_TRUE(got.guards_intact()) << what;
    };
    if (!backward) {
      Buffer out(s.dtype, rows * H * DV), lse(s.dtype, rows * H);
      out.upload(r);
      lse.upload(r);
      p.out = out.dev();
      p.lse = lse.dev();
      ASSERT_EQ(r.run(s, plan_attention_launch(s, rows, cols), &p), "");
      out.download(r);
      lse.download(r);
      expect_close("out", out, ref_out);
      expect_close("lse", lse, ref_lse);
      continue;
    }
    // Backward: dout random, lse and delta from the reference forward.
    Buffer dout(s.dtype, rows * H * DV), lse_in(s.dtype, rows * H), delta(s.dtype, rows * H);
    fill_random(&dout, 46);
    for (int64_t t = 0; t < rows * H; ++t) {
      lse_in.set(t, ref_lse[t]);
      double dl = 0;
      for (int64_t d = 0; d < DV; ++d) dl += dout.get(t * DV + d) * ref_out[t * DV + d];
      delta.set(t, dl);
    }
    std::vector<double> rdq(rows * H * D, 0), rdk(cols * H * D, 0), rdv(cols * H * DV, 0),
        rdb(nnz * H, 0), rda(rows * H * D, 0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t e = A.rowptr[i]; e < A.rowptr[i + 1]; ++e)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t j = A.col[e];
          const double z = score(i, j, e, h);
          if (z == -INFINITY) continue;
          const double prob = std::exp(act(z) - lse_in.get(i * H + h));
          const double keep = ref_keep(seed, dropout, e, h, H);
          double dp = 0;
          for (int64_t d = 0; d < DV; ++d)
            dp += dout.get((i * H + h) * DV + d) * v.get((j * H + h) * DV + d);
          const double dz = prob * (keep * dp - delta.get(i * H + h)) *
                            (mode == 1 && z < 0 ? slope : 1.0);
          rdb[e * H + h] = dz;
          for (int64_t d = 0; d < DV; ++d)
            rdv[(j * H + h) * DV + d] += prob * keep * dout.get((i * H + h) * DV + d);
          for (int64_t d = 0; d < D; ++d) {
            const double qd = q.get((i * H + h) * D + d), kd = k.get((j * H + h) * D + d);
            double gq = 1, gk = 1;
            if (mode == 0) {
              gq = scale * kd;
              gk = scale * qd;
            } else if (mode == 2) {
              const double u = qd + kd;
              gq = gk = att.get(h * D + d) * (u >= 0 ? 1 : slope);
              rda[(i * H + h) * D + d] += dz * (u < 0 ? u * slope : u);
            }
            rdq[(i * H + h) * D + d] += dz * gq;
            rdk[(j * H + h) * D + d] += dz * gk;
          }
        }
    // The transpose (by column, entries in row order), as csr_transpose builds it.
    Typed<I> trp(cols + 1), tcol(nnz), tperm(nnz);
    {
      std::vector<int64_t> cnt(cols + 1, 0);
      for (int64_t e = 0; e < nnz; ++e) cnt[A.col[e] + 1]++;
      for (int64_t c = 0; c < cols; ++c) cnt[c + 1] += cnt[c];
      for (int64_t c = 0; c <= cols; ++c) trp.set(c, I(cnt[c]));
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t e = A.rowptr[i]; e < A.rowptr[i + 1]; ++e) {
          const int64_t t = cnt[A.col[e]]++;
          tcol.set(t, I(i));
          tperm.set(t, I(e));
        }
    }
    Buffer dq(s.dtype, rows * H * D), dk(s.dtype, cols * H * D), dv(s.dtype, cols * H * DV);
    Buffer db(s.dtype, nnz * H), da(s.dtype, mode == 2 ? rows * H * D : 0);
    Buffer dzs(s.dtype, nnz * H), pks(s.dtype, nnz * H);
    Typed<int> bad_perm(1);
    bad_perm.set(0, 0);
    for (Bytes* b : std::initializer_list<Bytes*>{&dout, &lse_in, &delta, &dq, &dk, &dv, &db, &da,
                                                  &dzs, &pks, &trp, &tcol, &tperm, &bad_perm})
      b->upload(r);
    p.t_rowptr = trp.dev();
    p.t_col = tcol.dev();
    p.t_perm = tperm.dev();
    p.lse_in = lse_in.dev();
    p.delta = delta.dev();
    p.dout = dout.dev();
    p.dq = dq.dev();
    p.dk = dk.dev();
    p.dv = dv.dev();
    p.dbias = db.dev();
    p.datt_rows = mode == 2 ? da.dev() : nullptr;
    p.dz = dzs.dev();
    p.pk = pks.dev();
    p.bad_perm = static_cast<int*>(bad_perm.dev());
    ASSERT_EQ(r.run(s, plan_attention_launch(s, rows, cols), &p), "");
    for (Bytes* b : std::initializer_list<Bytes*>{&dq, &dk, &dv, &db, &da, &bad_perm})
      b->download(r);
    expect_close("dq", dq, rdq);
    expect_close("dk", dk, rdk);
    expect_close("dv", dv, rdv);
    expect_close("dbias", db, rdb);
    if (mode == 2) expect_close("datt_rows", da, rda);
    EXPECT_EQ(bad_perm.get(0), 0);
  }
}

}  // namespace sparsejit::codegen::checks
