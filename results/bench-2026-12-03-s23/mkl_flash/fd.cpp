#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <vector>
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
using FVec = at::vec::Vectorized<float>;
static inline float bf(uint16_t x) { uint32_t u = uint32_t(x) << 16; float f; std::memcpy(&f, &u, 4); return f; }

// modes: pv 0 = seq fma into C (from beta*C); 1 = acc4 tree over keys then C + s; 2 = seq from 0 then C + s
//        ex 0 = two accumulators alternating (AMX finding); 1 = one accumulator
std::tuple<torch::Tensor, torch::Tensor> fd(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale_d, int64_t pv, int64_t ex, int64_t qk) {
  const int64_t B = q.size(0), H = q.size(1), G = q.size(2), D = q.size(3), L = k.size(2);
  auto out = torch::empty({B, H, G, D}, q.options());
  auto lse = torch::empty({B, H, G}, q.options().dtype(torch::kFloat32));
  const float scale = float(scale_d), ninf = -std::numeric_limits<float>::infinity();
  const uint16_t* qp = (const uint16_t*)q.data_ptr(); const uint16_t* kp = (const uint16_t*)k.data_ptr();
  const uint16_t* vp = (const uint16_t*)v.data_ptr(); uint16_t* op = (uint16_t*)out.data_ptr();
  float* lp = lse.data_ptr<float>();
  for (int64_t p = 0; p < B * H; ++p) {
    const uint16_t* Q = qp + p * G * D; const uint16_t* K = kp + p * L * D; const uint16_t* V = vp + p * L * D;
    std::vector<float> mx(G, ninf), sm(G, 0.f), dst(G * D, 0.f), row(512); std::vector<uint16_t> pr(G * 512);
    for (int64_t n = 0; n < L; n += 512) {
      const int64_t kb = std::min<int64_t>(512, L - n);
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t j = 0; j < kb; ++j) {
          const int W = qk == 2 ? 1 : qk == 3 ? 8 : qk == 4 ? 2 : qk == 5 ? 16 : 4;
          float a[16] = {0};
          for (int64_t d = 0; d < D; d += W) for (int r = 0; r < W; ++r) a[r] = std::fma(bf(K[(n + j) * D + d + r]), bf(Q[g * D + d + r]), a[r]);
          if (W == 4) row[j] = qk == 0 ? (a[0] + a[2]) + (a[1] + a[3]) : ((a[0] + a[1]) + a[2]) + a[3];
          else { for (int w = W / 2; w >= 1; w /= 2) for (int r = 0; r < w; ++r) a[r] = a[r] + a[r + w]; row[j] = a[0]; }
        }
        // _mul_reduce_max_fusion_kernel
        FVec vmax(ninf); float tm = ninf; int64_t j = 0;
        for (; j < 8 * (kb / 8); j += 8) { FVec t = FVec::loadu(&row[j]) * FVec(scale); vmax = at::vec::maximum(vmax, t); t.store(&row[j]); }
        for (; j < kb; ++j) { float t = row[j] * scale; tm = std::max(tm, t); row[j] = t; }
        float tmax = std::max(tm, at::vec::vec_reduce_all<float>([](FVec& x, FVec& y) { return at::vec::maximum(x, y); }, vmax));
        tmax = mx[g] > tmax ? mx[g] : tmax;
        uint16_t* P = pr.data() + g * 512;
        if (tmax == ninf) { for (int64_t i = 0; i < kb; ++i) P[i] = 0; continue; }
        FVec acc0(0.f), acc1(0.f); j = 0;
        for (int64_t i = 0; j < 8 * (kb / 8); j += 8, ++i) {
          FVec t = (FVec::loadu(&row[j]) - FVec(tmax)).fexp_u20();
          if (ex == 0 && i % 2) acc1 += t; else acc0 += t;
          at::vec::convert_float_bfloat16(t, t).store(P + j, 8);
        }
        float s = at::vec::vec_reduce_all<float>([](FVec& x, FVec& y) { return x + y; }, ex == 0 ? acc0 + acc1 : acc0);
        for (; j < kb; ++j) { float t = std::exp(row[j] - tmax); s += t; P[j] = c10::BFloat16(t).x; }
        const float et = std::exp(mx[g] - tmax);
        sm[g] = std::fma(et, sm[g], s);
        mx[g] = tmax;
        if (n > 0) for (int64_t d = 0; d < D; ++d) dst[g * D + d] = dst[g * D + d] * et;
      }
      for (int64_t g = 0; g < G; ++g) {
        const uint16_t* P = pr.data() + g * 512;
        for (int64_t d = 0; d < D; ++d) {
          float c = n == 0 ? 0.f : dst[g * D + d];
          if (pv == 0) { for (int64_t j = 0; j < kb; ++j) c = std::fma(bf(V[(n + j) * D + d]), bf(P[j]), c); }
          else if (pv == 1) { float a[4] = {0,0,0,0}; int64_t j = 0;
            for (; j + 4 <= kb; j += 4) for (int r = 0; r < 4; ++r) a[r] = std::fma(bf(V[(n + j + r) * D + d]), bf(P[j + r]), a[r]);
            for (; j < kb; ++j) a[0] = std::fma(bf(V[(n + j) * D + d]), bf(P[j]), a[0]);
            c = c + ((a[0] + a[2]) + (a[1] + a[3])); }
          else if (pv == 2) { float s = 0; for (int64_t j = 0; j < kb; ++j) s = std::fma(bf(V[(n + j) * D + d]), bf(P[j]), s); c = c + s; }
          else if (pv >= 100) {  // first 8 d: keys split at S = pv % 1000, two seq sums added (pv < 1000) or second continues from first + 0?
            const int64_t S = std::min<int64_t>(pv % 1000, kb);
            if (d >= 8) { for (int64_t j = 0; j < kb; ++j) c = std::fma(bf(V[(n + j) * D + d]), bf(P[j]), c); }
            else { float s1 = 0, s2 = 0;
              for (int64_t j = 0; j < S; ++j) s1 = std::fma(bf(V[(n + j) * D + d]), bf(P[j]), s1);
              for (int64_t j = S; j < kb; ++j) s2 = std::fma(bf(V[(n + j) * D + d]), bf(P[j]), s2);
              c = pv < 1000 ? c + (s1 + s2) : (c + s1) + s2; } }
          else {  // pv 3..: first 8 d by W accumulators over keys (tree or sequential), the rest seq into C
            const int W = pv == 3 ? 2 : pv == 4 ? 4 : pv == 5 ? 8 : pv == 6 ? 4 : pv == 7 ? 2 : 16;
            if (d >= 8) { for (int64_t j = 0; j < kb; ++j) c = std::fma(bf(V[(n + j) * D + d]), bf(P[j]), c); }
            else { float a[16] = {0}; int64_t j = 0;
              for (; j + W <= kb; j += W) for (int r = 0; r < W; ++r) a[r] = std::fma(bf(V[(n + j + r) * D + d]), bf(P[j + r]), a[r]);
              for (; j < kb; ++j) a[0] = std::fma(bf(V[(n + j) * D + d]), bf(P[j]), a[0]);
              float s;
              if (pv == 6) s = ((a[0] + a[1]) + a[2]) + a[3];
              else if (pv == 7) { s = a[0] + a[1]; }
              else { for (int w = W / 2; w >= 1; w /= 2) for (int r = 0; r < w; ++r) a[r] = a[r] + a[r + w]; s = a[0]; }
              c = c + s; } }
          dst[g * D + d] = c;
        }
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      const float s = sm[g] == 0 ? 1.f : sm[g]; const float r = 1 / s;
      for (int64_t d = 0; d < D; d += 8) { FVec x = FVec::loadu(&dst[g * D + d]) * FVec(r); at::vec::convert_float_bfloat16(x, x).store(op + p * G * D + g * D + d, 8); }
      lp[p * G + g] = (mx[g] == ninf ? 0.f : mx[g]) + std::log(s);
    }
  }
  return {out, lse};
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("fd", &fd); }
