// Mixture of experts with top-k routing and a fixed capacity per expert
// (declare_moe in planner/src/ops_decl.cpp says what is kept; MoeShape the
// layout). Per sample, T tokens x of width D:
//
//   logits = x Wg^T [T, E];  p = softmax_rows(logits)          (fp32, kept)
//   chosen_t = the top_k experts of p_t, best first (lower index on ties)
//   gate_tj = p_t[chosen_tj], divided by sum_j p_t[chosen_tj] if normalize
//   slots: choice rank j = 0 first, then 1, ...; within a rank, tokens in
//     order (GShard's position-in-expert); a choice whose expert already has
//     C tokens is dropped (route -1): that expert adds nothing to the token
//   X_e = the tokens routed to expert e, in slot order (empty slots zero)
//   h1 = X_e W1^T, h3 = X_e W3^T, act = silu(h1) * h3, out_e = act W2^T
//     (h1, silu(h1), h3 and act kept, as autograd keeps them)
//   y_t = sum_j gate_tj out[slot_tj]  (over the choices not dropped)
//
// Mixtral trains dropless (every token reaches its k experts); a capacity
// factor of E / k or more drops nothing here and computes the same.
//
// Backward: d gate_tj = dy_t . out[slot_tj]; d out[slot] = gate dy_t; the
// SwiGLU MLP's gradients per expert; dx_t gains d X_e of each slot it took;
// the gates' gradient goes back through the renormalisation
// (d p_j = (d g_j - sum_i d g_i g_i) / S over the chosen j, S their sum) and
// the softmax (d logits = p * (d p - sum p d p)) to Wg and x.
#include "cpu/ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace dlplan::exec::cpu {
namespace {

// The top k experts of one token's probabilities, best first; ties go to the
// lower index, so that backward finds the same choices from the kept p.
void top_k(const float* p, int64_t E, int64_t k, int32_t* chosen) {
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  std::copy(order.begin(), order.begin() + k, chosen);
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

void moe_forward(OpContext& c) {
  const MoeShape s = moe_shape(*c.model, *c.node);
  const int64_t b = c.batch, T = s.T, D = s.D, E = s.E, k = s.k, F = s.F, C = s.C, R = s.rows();
  Tensor probs = alloc_saved(c, {b, T, E}, DType::f32, "probs");
  Tensor route = alloc_saved(c, {b, T, k}, DType::i32, "route");
  Tensor gates = alloc_saved(c, {b, T, k}, DType::f32, "gates");
  Tensor disp = alloc_saved(c, {b, R, D}, compute(c), "dispatched");
  Tensor h1 = alloc_saved(c, {b, R, F}, compute(c), "h1");
  Tensor silu = alloc_saved(c, {b, R, F}, compute(c), "silu");
  Tensor h3 = alloc_saved(c, {b, R, F}, compute(c), "h3");
  Tensor act = alloc_saved(c, {b, R, F}, compute(c), "act");
  Tensor eout = alloc_saved(c, {b, R, D}, compute(c), "expert_out");
  Fp32Buffer disp_b(disp), h1_b(h1), silu_b(silu), h3_b(h3), act_b(act), eout_b(eout);
  const float* wg = c.params[0].f();

  // Routing and dispatch.
  std::fill(disp_b.data(), disp_b.data() + b * R * D, 0.0f);
  std::vector<int32_t> chosen(static_cast<size_t>(T * k));
  std::vector<int64_t> count(static_cast<size_t>(E));
  for (int64_t n = 0; n < b; ++n) {
    const float* x = c.in[0].f() + n * T * D;
    float* p = probs.f() + n * T * E;
    gemm(false, true, T, E, D, 1.0f, x, D, wg, D, 0.0f, p, E);
    for (int64_t t = 0; t < T; ++t) {
      float* row = p + t * E;
      const float mx = *std::max_element(row, row + E);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (row[e] = std::exp(row[e] - mx));
      for (int64_t e = 0; e < E; ++e) row[e] /= sum;
      top_k(row, E, k, chosen.data() + t * k);
    }
    int32_t* rt = route.i() + n * T * k;
    float* g = gates.f() + n * T * k;
    std::fill(count.begin(), count.end(), 0);
    for (int64_t j = 0; j < k; ++j)
      for (int64_t t = 0; t < T; ++t) {
        const int32_t e = chosen[static_cast<size_t>(t * k + j)];
        int64_t& used = count[static_cast<size_t>(e)];
        rt[t * k + j] = used < C ? static_cast<int32_t>(e * C + used++) : -1;
      }
    for (int64_t t = 0; t < T; ++t) {
      float chosen_sum = 0;
      for (int64_t j = 0; j < k; ++j) chosen_sum += p[t * E + chosen[static_cast<size_t>(t * k + j)]];
      for (int64_t j = 0; j < k; ++j) {
        const float pj = p[t * E + chosen[static_cast<size_t>(t * k + j)]];
        g[t * k + j] = s.normalize ? pj / chosen_sum : pj;
        if (rt[t * k + j] >= 0)
          std::memcpy(disp_b.data() + (n * R + rt[t * k + j]) * D, x + t * D, static_cast<size_t>(D) * sizeof(float));
      }
    }
  }
  disp_b.store();

  // The experts, one SwiGLU MLP each over its C slots.
  for (int64_t n = 0; n < b; ++n)
    for (int64_t e = 0; e < E; ++e) {
      const float* xe = disp_b.data() + (n * R + e * C) * D;
      gemm(false, true, C, F, D, 1.0f, xe, D, c.params[static_cast<size_t>(MoeShape::w1(e))].f(), D, 0.0f,
           h1_b.data() + (n * R + e * C) * F, F);
      gemm(false, true, C, F, D, 1.0f, xe, D, c.params[static_cast<size_t>(MoeShape::w3(e))].f(), D, 0.0f,
           h3_b.data() + (n * R + e * C) * F, F);
    }
  h1_b.store();
  h3_b.store();
  for (int64_t i = 0; i < b * R * F; ++i) silu_b.data()[i] = h1_b.data()[i] * sigmoid(h1_b.data()[i]);
  silu_b.store();
  for (int64_t i = 0; i < b * R * F; ++i) act_b.data()[i] = silu_b.data()[i] * h3_b.data()[i];
  act_b.store();
  for (int64_t n = 0; n < b; ++n)
    for (int64_t e = 0; e < E; ++e)
      gemm(false, true, C, D, F, 1.0f, act_b.data() + (n * R + e * C) * F, F,
           c.params[static_cast<size_t>(MoeShape::w2(e))].f(), F, 0.0f, eout_b.data() + (n * R + e * C) * D, D);
  eout_b.store();

  // Combine: each token's expert outputs times its gates.
  float* y = c.out.f();
  std::fill(y, y + b * T * D, 0.0f);
  for (int64_t n = 0; n < b; ++n)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t slot = route.i()[(n * T + t) * k + j];
        if (slot < 0) continue;
        const float gv = gates.f()[(n * T + t) * k + j];
        const float* o = eout_b.data() + (n * R + slot) * D;
        float* yt = y + (n * T + t) * D;
        for (int64_t d = 0; d < D; ++d) yt[d] += gv * o[d];
      }
  for (Tensor* t : {&probs, &route, &gates, &disp, &h1, &silu, &h3, &act, &eout}) c.saved.push_back(*t);
}

void moe_backward(OpContext& c) {
  const MoeShape s = moe_shape(*c.model, *c.node);
  const int64_t b = c.batch, T = s.T, D = s.D, E = s.E, k = s.k, F = s.F, C = s.C, R = s.rows();
  const float* x = c.in[0].f();
  const float* dy = c.dout.f();
  const float* probs = saved_named(c, "probs").f();
  const int32_t* route = saved_named(c, "route").i();
  const float* gates = saved_named(c, "gates").f();
  const float* disp = saved_named(c, "dispatched").f();
  const float* h1 = saved_named(c, "h1").f();
  const float* silu = saved_named(c, "silu").f();
  const float* h3 = saved_named(c, "h3").f();
  const float* act = saved_named(c, "act").f();
  const float* eout = saved_named(c, "expert_out").f();
  Tensor deout_t = alloc_temp(c, {b, R, D}, "dexpert_out"), dact_t = alloc_temp(c, {b, R, F}, "dact");
  Tensor dh1_t = alloc_temp(c, {b, R, F}, "dh1"), dh3_t = alloc_temp(c, {b, R, F}, "dh3");
  Tensor ddisp_t = alloc_temp(c, {b, R, D}, "ddispatched"), dprobs_t = alloc_temp(c, {b, T, E}, "dprobs");
  Fp32Buffer deout_b(deout_t), dact_b(dact_t), dh1_b(dh1_t), dh3_b(dh3_t), ddisp_b(ddisp_t), dprobs_b(dprobs_t);
  float *deout = deout_b.data(), *dact = dact_b.data(), *dh1 = dh1_b.data(), *dh3 = dh3_b.data();
  float *ddisp = ddisp_b.data(), *dprobs = dprobs_b.data();
  float* dx = grad_or_null(c.din[0]);

  // The gates' gradient (into dprobs, at the chosen experts) and each slot's
  // output gradient.
  std::fill(deout, deout + b * R * D, 0.0f);
  std::fill(dprobs, dprobs + b * T * E, 0.0f);
  std::vector<int32_t> chosen(static_cast<size_t>(k));
  std::vector<float> dgate(static_cast<size_t>(k));
  for (int64_t n = 0; n < b; ++n)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = n * T + t;
      const float* dyt = dy + row * D;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t slot = route[row * k + j];
        float dg = 0;
        if (slot >= 0) {
          const float* o = eout + (n * R + slot) * D;
          float* dout_slot = deout + (n * R + slot) * D;
          const float gv = gates[row * k + j];
          for (int64_t d = 0; d < D; ++d) {
            dg += dyt[d] * o[d];
            dout_slot[d] = gv * dyt[d];
          }
        }
        dgate[static_cast<size_t>(j)] = dg;
      }
      const float* p = probs + row * E;
      top_k(p, E, k, chosen.data());
      float chosen_sum = 0, dg_dot_g = 0;
      for (int64_t j = 0; j < k; ++j) {
        chosen_sum += p[chosen[static_cast<size_t>(j)]];
        dg_dot_g += dgate[static_cast<size_t>(j)] * gates[row * k + j];
      }
      float* dp = dprobs + row * E;
      for (int64_t j = 0; j < k; ++j) {
        const float dg = dgate[static_cast<size_t>(j)];
        dp[chosen[static_cast<size_t>(j)]] += s.normalize ? (dg - dg_dot_g) / chosen_sum : dg;
      }
      float p_dot_dp = 0;  // softmax backward, in place: d logits = p (dp - sum p dp)
      for (int64_t e = 0; e < E; ++e) p_dot_dp += p[e] * dp[e];
      for (int64_t e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - p_dot_dp);
    }

  // The experts' SwiGLU MLPs.
  for (int64_t n = 0; n < b; ++n)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t fo = (n * R + e * C) * F, dof = (n * R + e * C) * D;
      const float* w2 = c.params[static_cast<size_t>(MoeShape::w2(e))].f();
      gemm(false, false, C, F, D, 1.0f, deout + dof, D, w2, F, 0.0f, dact + fo, F);
      if (float* dw2 = grad_or_null(c.dparams[static_cast<size_t>(MoeShape::w2(e))]))
        gemm(true, false, D, F, C, 1.0f, deout + dof, D, act + fo, F, 1.0f, dw2, F);
      for (int64_t i = 0; i < C * F; ++i) {  // act = silu(h1) h3; silu'(v) = sig(v) (1 + v (1 - sig(v)))
        const float v = h1[fo + i], sg = sigmoid(v);
        dh1[fo + i] = dact[fo + i] * h3[fo + i] * sg * (1.0f + v * (1.0f - sg));
        dh3[fo + i] = dact[fo + i] * silu[fo + i];
      }
      const float* w1 = c.params[static_cast<size_t>(MoeShape::w1(e))].f();
      const float* w3 = c.params[static_cast<size_t>(MoeShape::w3(e))].f();
      if (float* dw1 = grad_or_null(c.dparams[static_cast<size_t>(MoeShape::w1(e))]))
        gemm(true, false, F, D, C, 1.0f, dh1 + fo, F, disp + dof, D, 1.0f, dw1, D);
      if (float* dw3 = grad_or_null(c.dparams[static_cast<size_t>(MoeShape::w3(e))]))
        gemm(true, false, F, D, C, 1.0f, dh3 + fo, F, disp + dof, D, 1.0f, dw3, D);
      if (dx) {
        gemm(false, false, C, D, F, 1.0f, dh1 + fo, F, w1, D, 0.0f, ddisp + dof, D);
        gemm(false, false, C, D, F, 1.0f, dh3 + fo, F, w3, D, 1.0f, ddisp + dof, D);
      }
    }

  // The router and the input: dWg += dlogits^T x; dx += dlogits Wg and each
  // token's share of its experts' input gradients.
  for (int64_t n = 0; n < b; ++n) {
    const float* dl = dprobs + n * T * E;
    if (float* dwg = grad_or_null(c.dparams[0])) gemm(true, false, E, D, T, 1.0f, dl, E, x + n * T * D, D, 1.0f, dwg, D);
    if (!dx) continue;
    gemm(false, false, T, D, E, 1.0f, dl, E, c.params[0].f(), D, 1.0f, dx + n * T * D, D);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t slot = route[(n * T + t) * k + j];
        if (slot < 0) continue;
        const float* src = ddisp + (n * R + slot) * D;
        float* dst = dx + (n * T + t) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
      }
  }
}

}  // namespace dlplan::exec::cpu
