// The int8 executor's activation quantizer and epilogue: each one pass over memory with the eager chain's values.
#pragma once

#include "common.h"

// x [M, K] (float32, bfloat16 or float16; rows may be strided, columns contiguous) -> (q int8 [M, K], s fp32 [M, 1])
std::vector<torch::Tensor> quant_act_int8(torch::Tensor x, int64_t qmax) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "quant_act_int8: x must be a 2-D CPU tensor");
  if (x.stride(1) != 1) x = x.contiguous();
  const int64_t m = x.size(0), k = x.size(1), ld = x.stride(0);
  auto q = torch::empty({m, k}, x.options().dtype(torch::kInt8));
  auto s = torch::empty({m, 1}, x.options().dtype(torch::kFloat32));
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = s.data_ptr<float>();
  const int qm = static_cast<int>(qmax);
  switch (x.scalar_type()) {
    case torch::kFloat32: quant_rows(x.data_ptr<float>(), m, k, ld, qm, qp, sp); break;
    case torch::kBFloat16: quant_rows(x.data_ptr<c10::BFloat16>(), m, k, ld, qm, qp, sp); break;
    case torch::kHalf: quant_rows(x.data_ptr<c10::Half>(), m, k, ld, qm, qp, sp); break;
    default: TORCH_CHECK(false, "quant_act_int8: dtype must be float32, bfloat16 or float16, got ", x.scalar_type());
  }
  return {q, s};
}

namespace {
template <typename O>
void epilogue_rows(const int32_t* acc, int64_t ld, const float* s_a, const float* s_w, bool s_w_scalar,
                   int64_t rows, int64_t col0, int64_t n, O* out) {
  for (int64_t m = 0; m < rows; ++m) {
    const int32_t* a = acc + m * ld + col0;
    const float sa = s_a[m];
    O* o = out + m * n;
    if (s_w_scalar) {
      const float sw = s_w[0];
      for (int64_t j = 0; j < n; ++j) store_f((static_cast<float>(a[j]) * sw) * sa, o + j);
    } else {
      const float* sw = s_w + col0;
      for (int64_t j = 0; j < n; ++j) store_f((static_cast<float>(a[j]) * sw[j]) * sa, o + j);
    }
  }
}
}  // namespace

// acc int32 [M, >= sum(sizes)] (rows may be strided), s_a fp32 [M, 1], s_w fp32 [N] or [] ->
// one contiguous [M, sizes[i]] tensor per member, dtype out_dtype: out((s_w * float(acc)) * s_a)
std::vector<torch::Tensor> epilogue(torch::Tensor acc, torch::Tensor s_a, torch::Tensor s_w,
                                    std::vector<int64_t> sizes, torch::ScalarType out_dtype) {
  TORCH_CHECK(acc.dim() == 2 && acc.scalar_type() == torch::kInt32 && acc.device().is_cpu(),
              "epilogue: acc must be a 2-D int32 CPU tensor");
  if (acc.stride(1) != 1) acc = acc.contiguous();
  s_a = s_a.contiguous();
  s_w = s_w.contiguous();
  TORCH_CHECK(s_a.scalar_type() == torch::kFloat32 && s_w.scalar_type() == torch::kFloat32, "epilogue: fp32 scales");
  const int64_t m = acc.size(0);
  TORCH_CHECK(s_a.numel() == m, "epilogue: s_a must hold one scale per row");
  int64_t total = 0;
  for (auto n : sizes) total += n;
  TORCH_CHECK(total <= acc.size(1), "epilogue: the members' sizes exceed the accumulator's columns");
  const bool scalar = s_w.numel() == 1;  // [] or [1]: broadcast over the columns, as torch.mul does
  TORCH_CHECK(scalar || s_w.numel() >= total, "epilogue: s_w must be a scalar or hold one scale per column");
  std::vector<torch::Tensor> outs;
  int64_t col0 = 0;
  for (auto n : sizes) {
    auto o = torch::empty({m, n}, acc.options().dtype(out_dtype));
    const int32_t* ap = acc.data_ptr<int32_t>();
    const float* sap = s_a.data_ptr<float>();
    const float* swp = s_w.data_ptr<float>();
    switch (out_dtype) {
      case torch::kFloat32: epilogue_rows(ap, acc.stride(0), sap, swp, scalar, m, col0, n, o.data_ptr<float>()); break;
      case torch::kBFloat16:
        epilogue_rows(ap, acc.stride(0), sap, swp, scalar, m, col0, n, o.data_ptr<c10::BFloat16>());
        break;
      case torch::kHalf: epilogue_rows(ap, acc.stride(0), sap, swp, scalar, m, col0, n, o.data_ptr<c10::Half>()); break;
      default: TORCH_CHECK(false, "epilogue: out_dtype must be float32, bfloat16 or float16");
    }
    outs.push_back(o);
    col0 += n;
  }
  return outs;
}
