// Builds a small random graph, aggregates node features with sparsejit::spmm and checks the
// result against a plain LibTorch gather / scatter.
#include <sparsejit/sparsejit.h>
#include <torch/torch.h>

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

  // R-GCN's relational aggregation: Y[i] = sum_r mean_{j in N_r(i)} X[j] W[r].
  {
    const int64_t relations = 5, f_out = 16;
    at::Tensor edge_type = torch::randint(relations, {num_edges}, torch::kLong);
    at::Tensor w = torch::randn({relations, features, f_out});
    sparsejit::TypedCsr t = sparsejit::TypedCsr::from_edge_index(edge_index, edge_type, num_nodes,
                                                                 relations);
    at::Tensor y = sparsejit::rgms(t, x, w, "mean");
    at::Tensor ref = torch::zeros({num_nodes, f_out});
    for (int64_t r = 0; r < relations; ++r) {
      at::Tensor m = edge_type.eq(r);
      at::Tensor src = edge_index[0].masked_select(m), dst = edge_index[1].masked_select(m);
      at::Tensor agg = torch::zeros({num_nodes, features}).index_add_(0, dst, x.index_select(0, src));
      at::Tensor deg = torch::bincount(dst, {}, num_nodes).clamp_min(1).to(torch::kFloat);
      ref += (agg / deg.unsqueeze(1)).mm(w[r]);
    }
    const double err = (y - ref).abs().max().item<double>();
    std::cout << "rgms reduce=mean max abs error vs per-relation loop: " << err << "\n";
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
