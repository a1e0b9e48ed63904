// The int8 executor's activation quantizer and epilogue, and the aligned learner's fake quantization of activations
// and of the KV cache: each one pass over memory with the eager chain's values.
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
template <typename T>
void fake_quant_rows(const T* x, int64_t rows, int64_t k, int64_t ld, int qmax, float* out) {
  const float lo = -float(qmax + 1), hi = float(qmax);
  for (int64_t m = 0; m < rows; ++m) {
    const T* row = x + m * ld;
    const float amax = row_amax(row, k);
    float* o = out + m * k;
    if (!std::isfinite(amax)) {  // a NaN or inf in the row: the eager chain gives NaN everywhere (codes * NaN|inf
      for (int64_t j = 0; j < k; ++j) o[j] = NAN;  // scale, plus x - x = NaN), whatever the codes were
      continue;
    }
    const float inv = amax == 0.f ? 0.f : (1.0f / amax) * float(qmax);
    const float sc = amax / float(qmax);
    // q.float() * s, then + (x - x.detach()) = + 0 (-0 would become +0, as in the eager straight-through sum).
    // The code is kept as a float: with a finite amax every value here is finite, so the clamped, rounded value is
    // already the integer code (the int8 round trip of to_code is the identity on it), and the loop vectorizes.
    for (int64_t j = 0; j < k; ++j) {
      float v = load_f(row[j]) * inv;
      v = v < lo ? lo : v;
      v = v > hi ? hi : v;
      o[j] = std::nearbyint(v) * sc + 0.0f;
    }
  }
}
}  // namespace

// x [M, K] (rows may be strided) -> fp32 [M, K]: the dequantized per-token int8 activation (half-even rounding)
torch::Tensor fake_quant_act_int8(torch::Tensor x, int64_t qmax) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "fake_quant_act_int8: x must be a 2-D CPU tensor");
  if (x.stride(1) != 1) x = x.contiguous();
  const int64_t m = x.size(0), k = x.size(1), ld = x.stride(0);
  auto out = torch::empty({m, k}, x.options().dtype(torch::kFloat32));
  float* op = out.data_ptr<float>();
  const int qm = static_cast<int>(qmax);
  switch (x.scalar_type()) {
    case torch::kFloat32: fake_quant_rows(x.data_ptr<float>(), m, k, ld, qm, op); break;
    case torch::kBFloat16: fake_quant_rows(x.data_ptr<c10::BFloat16>(), m, k, ld, qm, op); break;
    case torch::kHalf: fake_quant_rows(x.data_ptr<c10::Half>(), m, k, ld, qm, op); break;
    default: TORCH_CHECK(false, "fake_quant_act_int8: dtype must be float32, bfloat16 or float16, got ", x.scalar_type());
  }
  return out;
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

namespace {
template <typename T>
void fake_quant_kv_rows(const T* t, int64_t rows, int64_t d, int qmax, bool trunc, float min_scale, T* out,
                        float* s) {
  const float lo = -float(qmax + 1), hi = float(qmax);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = t + r * d;
    const float amax = row_amax(row, d);
    float sc = amax / float(qmax);
    sc = sc < min_scale ? min_scale : sc;
    s[r] = sc;
    T* o = out + r * d;
    if (!std::isfinite(amax)) {  // NaN or inf in the row: NaN everywhere, as the eager chain gives
      for (int64_t j = 0; j < d; ++j) store_f(NAN, o + j);
      continue;
    }
    const float inv = 1.0f / sc;
    for (int64_t j = 0; j < d; ++j) {
      const float code = static_cast<float>(to_code(load_f(row[j]) * inv, lo, hi, trunc));
      // dequant_kv: float(q) * s rounded to t's dtype; then + (t - t) * keep = + 0 in t's dtype (-0 -> +0)
      T v;
      store_f(code * sc, &v);
      store_f(load_f(v) + 0.0f, o + j);
    }
  }
}
}  // namespace

// t [..., D] -> (fake-quantized t in t's dtype, s fp32 [..., 1])
std::vector<torch::Tensor> fake_quant_kv_int8(torch::Tensor t, int64_t qmax, bool trunc, double min_scale) {
  TORCH_CHECK(t.dim() >= 1 && t.device().is_cpu(), "fake_quant_kv_int8: t must be a CPU tensor");
  t = t.contiguous();
  const int64_t d = t.size(-1), rows = d ? t.numel() / d : 0;
  auto out = torch::empty(t.sizes(), t.options());
  auto sshape = t.sizes().vec();
  sshape.back() = 1;
  auto s = torch::empty(sshape, t.options().dtype(torch::kFloat32));
  float* sp = s.data_ptr<float>();
  const int qm = static_cast<int>(qmax);
  const float ms = static_cast<float>(min_scale);
  switch (t.scalar_type()) {
    case torch::kFloat32:
      fake_quant_kv_rows(t.data_ptr<float>(), rows, d, qm, trunc, ms, out.data_ptr<float>(), sp);
      break;
    case torch::kBFloat16:
      fake_quant_kv_rows(t.data_ptr<c10::BFloat16>(), rows, d, qm, trunc, ms, out.data_ptr<c10::BFloat16>(), sp);
      break;
    case torch::kHalf:
      fake_quant_kv_rows(t.data_ptr<c10::Half>(), rows, d, qm, trunc, ms, out.data_ptr<c10::Half>(), sp);
      break;
    default: TORCH_CHECK(false, "fake_quant_kv_int8: dtype must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
  return {out, s};
}
