// segment_matmul from ATen's GEMM (dense_composite.h).
#include "torch_ext/composite/dense_composite.h"

namespace sparsejit::composite {

void segment_matmul(const tx::Tensor& x, const tx::Tensor& w, const int64_t* seg,
                    tx::Tensor& y) {
  for (int64_t k = 0; k < w.size(0); ++k) {
    if (seg[k + 1] == seg[k]) continue;
    auto y_k = y.narrow(0, seg[k], seg[k + 1] - seg[k]);
    tx::mm_out(y_k, x.narrow(0, seg[k], seg[k + 1] - seg[k]), w[k]);
  }
}

void segment_matmul_grad_w(const tx::Tensor& x, const tx::Tensor& dy, const int64_t* seg,
                           tx::Tensor& dw) {
  for (int64_t k = 0; k < dw.size(0); ++k) {
    auto dw_k = dw[k];
    tx::mm_out(dw_k, x.narrow(0, seg[k], seg[k + 1] - seg[k]).t(),
               dy.narrow(0, seg[k], seg[k + 1] - seg[k]));
  }
}

}  // namespace sparsejit::composite
