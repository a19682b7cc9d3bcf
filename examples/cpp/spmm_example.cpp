// Builds a small random graph, aggregates node features with sparsejit::spmm and checks the
// result against a plain LibTorch gather / scatter.
#include <sparsejit/sparsejit.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>

int main() {
  torch::manual_seed(0);
  const int64_t num_nodes = 1000, num_edges = 8000, features = 64;
  at::Tensor edge_index = torch::randint(num_nodes, {2, num_edges}, torch::kLong);
  at::Tensor x = torch::randn({num_nodes, features});

  sparsejit::CsrMatrix a = sparsejit::CsrMatrix::from_edge_index(edge_index, num_nodes);
  std::cout << "graph: " << a.rows << " nodes, " << a.nnz() << " edges\n";

  for (const char* reduce : {"sum", "mean", "max"}) {
    at::Tensor y = sparsejit::spmm(a, x, reduce);
    at::Tensor src = edge_index[0], dst = edge_index[1];
    at::Tensor msg = x.index_select(0, src);
    at::Tensor ref = torch::zeros({num_nodes, features});
    if (std::string(reduce) == "max") {
      ref = ref.scatter_reduce(0, dst.unsqueeze(1).expand_as(msg), msg, "amax", false);
    } else {
      ref.index_add_(0, dst, msg);
      if (std::string(reduce) == "mean") {
        at::Tensor deg = torch::bincount(dst, {}, num_nodes).clamp_min(1).to(torch::kFloat);
        ref = ref / deg.unsqueeze(1);
      }
    }
    const double err = (y - ref).abs().max().item<double>();
    std::cout << "spmm reduce=" << reduce << " max abs error vs gather/scatter: " << err << "\n";
    if (!(err < 1e-4)) return 1;
  }

  // Fused sparse attention (dot, GAT, GATv2) against a per-edge softmax written with
  // gather / scatter. The CSR order of the entries is the order of a.rowptr / a.col.
  {
    const int64_t heads = 4, d = 8, dv = 16;
    at::Tensor row = torch::repeat_interleave(a.rowptr.slice(0, 1) - a.rowptr.slice(0, 0, -1));
    at::Tensor col = a.col.to(torch::kLong);
    auto attend = [&](const at::Tensor& score, const at::Tensor& v) {  // score [nnz, H]
      at::Tensor mx = torch::full({num_nodes, heads}, -INFINITY).scatter_reduce(
          0, row.unsqueeze(1).expand_as(score), score, "amax", true);
      at::Tensor e = (score - mx.index_select(0, row)).exp();
      at::Tensor den = torch::zeros({num_nodes, heads}).index_add_(0, row, e);
      at::Tensor p = e / den.index_select(0, row);
      return torch::zeros({num_nodes, heads, v.size(2)})
          .index_add_(0, row, p.unsqueeze(2) * v.index_select(0, col));
    };
    auto check = [](const char* what, const at::Tensor& y, const at::Tensor& ref) {
      const double err = (y - ref).abs().max().item<double>();
      std::cout << what << " max abs error vs gather/softmax/scatter: " << err << "\n";
      return err < 1e-3;  // as the RGMS and conv checks below (float32 sums and exps)
    };
    at::Tensor q = torch::randn({num_nodes, heads, d}), k = torch::randn({num_nodes, heads, d});
    at::Tensor v = torch::randn({num_nodes, heads, dv}), bias = torch::randn({a.nnz(), heads});
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    at::Tensor y = sparsejit::sparse_attention(a, q, k, v, -1.0, bias);
    at::Tensor s = (q.index_select(0, row) * k.index_select(0, col)).sum(-1) * scale + bias;
    if (!check("sparse_attention (dot, 4 heads, bias)", y, attend(s, v))) return 1;

    at::Tensor a_dst = torch::randn({num_nodes, heads}), a_src = torch::randn({num_nodes, heads});
    y = sparsejit::gat_attention(a, a_dst, a_src, v, 0.2);
    s = torch::leaky_relu(a_dst.index_select(0, row) + a_src.index_select(0, col), 0.2);
    if (!check("gat_attention", y, attend(s, v))) return 1;

    at::Tensor att = torch::randn({heads, d});
    y = sparsejit::gatv2_attention(a, q, k, att, std::nullopt, 0.2);
    s = (torch::leaky_relu(q.index_select(0, row) + k.index_select(0, col), 0.2) * att).sum(-1);
    if (!check("gatv2_attention (V = x_src)", y, attend(s, k))) return 1;

    try {  // keys of the wrong length are named
      sparsejit::sparse_attention(a, q, k.slice(0, 1), v);
      std::cerr << "expected an error for keys with too few rows\n";
      return 1;
    } catch (const c10::Error& e) {
      std::cout << "rejected bad keys: " << e.what_without_backtrace() << "\n";
    }
  }

  // R-GCN's relational aggregation: Y[i] = sum_r mean_{j in N_r(i)} X[j] W[r].
  {
    const int64_t relations = 5, f_out = 16;
    at::Tensor edge_type = torch::randint(relations, {num_edges}, torch::kLong);
    at::Tensor w = torch::randn({relations, features, f_out});
    sparsejit::TypedCsr t = sparsejit::TypedCsr::from_edge_index(edge_index, edge_type, num_nodes,
                                                                 relations);
    // An R-GCN layer: the self-connection (X @ root) and bias fused into the same pass.
    at::Tensor root = torch::randn({features, f_out}), bias = torch::randn({f_out});
    at::Tensor y = sparsejit::rgms(t, x, w, "mean", std::nullopt, root, bias);
    at::Tensor ref = x.mm(root) + bias;
    for (int64_t r = 0; r < relations; ++r) {
      at::Tensor m = edge_type.eq(r);
      at::Tensor src = edge_index[0].masked_select(m), dst = edge_index[1].masked_select(m);
      at::Tensor agg = torch::zeros({num_nodes, features}).index_add_(0, dst, x.index_select(0, src));
      at::Tensor deg = torch::bincount(dst, {}, num_nodes).clamp_min(1).to(torch::kFloat);
      ref += (agg / deg.unsqueeze(1)).mm(w[r]);
    }
    const double err = (y - ref).abs().max().item<double>();
    std::cout << "rgms reduce=mean (root, bias) max abs error vs per-relation loop: " << err
              << "\n";
    if (!(err < 1e-3)) return 1;
  }

  // Point-cloud sparse convolution: a submanifold 3x3x3 conv on a small cloud, checked against
  // conv3d on the dense grid evaluated at the sites.
  {
    const int64_t side = 6, c_in = 3, c_out = 4;
    at::Tensor flat = torch::randperm(side * side * side, torch::kLong).slice(0, 0, 50);
    at::Tensor coords = torch::stack({torch::zeros_like(flat), flat.div(side * side, "floor"),
                                      flat.div(side, "floor").remainder(side), flat.remainder(side)},
                                     1).to(torch::kInt);
    at::Tensor feats = torch::randn({50, c_in});
    at::Tensor w = torch::randn({27, c_in, c_out});
    auto map = sparsejit::ConvMap::build(coords, {side, side, side}, 1, "subm", {3, 3, 3},
                                         {1, 1, 1}, {1, 1, 1}, {1, 1, 1});
    at::Tensor y = sparsejit::point_conv(feats, w, std::nullopt, map);
    at::Tensor dense = torch::zeros({1, c_in, side, side, side});
    at::Tensor l = coords.to(torch::kLong);
    dense.index_put_({0, torch::indexing::Slice(), l.select(1, 1), l.select(1, 2), l.select(1, 3)},
                     feats.t());
    // [K, C_in, C_out] -> conv3d's [C_out, C_in, 3, 3, 3]
    at::Tensor ref = torch::conv3d(dense, w.permute({2, 1, 0}).reshape({c_out, c_in, 3, 3, 3}),
                                   {}, 1, 1);
    ref = ref.index({0, torch::indexing::Slice(), l.select(1, 1), l.select(1, 2), l.select(1, 3)})
              .t();
    const double err = (y - ref).abs().max().item<double>();
    std::cout << "point_conv (subm 3x3x3) max abs error vs conv3d: " << err << "\n";
    if (!(err < 1e-3)) return 1;
  }

  // Bad input is reported, not crashed on.
  try {
    sparsejit::CsrMatrix::from_csr(torch::tensor({0, 2}, torch::kLong),
                                   torch::tensor({0, 5}, torch::kLong), 3);
    std::cerr << "expected an error for an out-of-range column\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cout << "rejected bad CSR: " << e.what_without_backtrace() << "\n";
  }
  std::cout << "OK\n";
  return 0;
}
