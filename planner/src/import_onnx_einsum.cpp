// torch.einsum of two tensors that is a batched matrix product (MaxViT's
// "B G H I D, B G H J D -> B G H I J" for q k^T and "B G H I J, B G H J D ->
// B G H I D" for p v), rewritten before shape inference as MatMul with the
// Transposes it needs: ONNX 1.12's shape inference leaves such an Einsum's
// output unknown, which stopped everything after it, and a MatMul of two
// activations is the IR's matmul. PyTorch runs such an einsum as bmm on
// operands permuted and reshaped to [batch, m, k] and [batch, k, n], copies
// where the permutation needs one, and keeps those; the IR's matmul keeps
// its operands, the transposes' copies among them. Any other equation is left
// as it is (an opaque op where its shape is known).
#include "import_onnx_graph.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <string>

namespace dlplan::onnx_import {
namespace {

struct Terms {
  std::string a, b, out;
};

// "B G H I D, B G H J D -> B G H I J" -> {"BGHID", "BGHJD", "BGHIJ"}; nothing
// for an equation with an ellipsis, other than two inputs, or a repeated letter.
std::optional<Terms> parse(std::string eq) {
  eq.erase(std::remove_if(eq.begin(), eq.end(), [](char c) { return c == ' '; }), eq.end());
  const auto arrow = eq.find("->"), comma = eq.find(',');
  if (arrow == std::string::npos || comma == std::string::npos || comma > arrow ||
      eq.find(',', comma + 1) != std::string::npos || eq.find('.') != std::string::npos)
    return std::nullopt;
  Terms t{eq.substr(0, comma), eq.substr(comma + 1, arrow - comma - 1), eq.substr(arrow + 2)};
  for (const auto* s : {&t.a, &t.b, &t.out})
    if (std::set<char>(s->begin(), s->end()).size() != s->size() || s->empty() ||
        !std::all_of(s->begin(), s->end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); }))
      return std::nullopt;
  return t;
}

// How the einsum is lhs [.., m, k] x rhs [.., k, n] = out [.., m, n]: which
// input is the lhs, and whether each operand's last two axes must be swapped.
struct Product {
  int lhs;  // 0 or 1
  bool swap_lhs, swap_rhs;
};

std::optional<Product> as_batched_matmul(const Terms& t) {
  const size_t r = t.a.size();
  if (r < 2 || t.b.size() != r || t.out.size() != r) return std::nullopt;
  const std::string batch = t.a.substr(0, r - 2);
  if (t.b.substr(0, r - 2) != batch || t.out.substr(0, r - 2) != batch) return std::nullopt;
  const std::string a2 = t.a.substr(r - 2), b2 = t.b.substr(r - 2), o2 = t.out.substr(r - 2);
  // The contracted letter: in both inputs' last two, not in the output.
  char k = 0;
  for (char c : a2)
    if (b2.find(c) != std::string::npos && o2.find(c) == std::string::npos) k = c;
  if (!k) return std::nullopt;
  const char m = a2[0] == k ? a2[1] : a2[0], n = b2[0] == k ? b2[1] : b2[0];
  if (m == n || o2.find(m) == std::string::npos || o2.find(n) == std::string::npos) return std::nullopt;
  // out [m, n]: a x b; out [n, m]: b x a.
  const bool a_first = o2[0] == m;
  const std::string& lhs = a_first ? a2 : b2;  // wanted [row, k]
  const std::string& rhs = a_first ? b2 : a2;  // wanted [k, col]
  return Product{a_first ? 0 : 1, lhs[0] == k, rhs[1] == k};
}

}  // namespace

int lower_einsum_matmuls(onnx::ModelProto& model) {
  auto* g = model.mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> out;
  int lowered = 0;
  for (const auto& n : g->node()) {
    const bool two = n.op_type() == "Einsum" && n.input_size() == 2 && n.output_size() == 1 && !n.input(0).empty() &&
                     !n.input(1).empty() && !n.output(0).empty();
    const auto* eq = two ? attr(n, "equation") : nullptr;
    const auto terms = eq ? parse(eq->s()) : std::nullopt;
    const auto p = terms ? as_batched_matmul(*terms) : std::nullopt;
    if (!p) {
      *out.Add() = n;
      continue;
    }
    const auto rank = static_cast<int64_t>(terms->a.size());
    auto operand = [&](int which, bool swap, const char* side) {
      const std::string& t = n.input(which);
      if (!swap) return t;
      onnx::NodeProto* tr = out.Add();
      tr->set_op_type("Transpose");
      tr->set_name(n.name() + "/" + side + "_transposed");
      tr->add_input(t);
      tr->add_output(n.output(0) + "#" + side + "_transposed");
      auto* perm = tr->add_attribute();
      perm->set_name("perm");
      perm->set_type(onnx::AttributeProto::INTS);
      for (int64_t a = 0; a < rank; ++a) perm->add_ints(a < rank - 2 ? a : a == rank - 2 ? rank - 1 : rank - 2);
      return tr->output(0);
    };
    const std::string lhs = operand(p->lhs, p->swap_lhs, "lhs"), rhs = operand(1 - p->lhs, p->swap_rhs, "rhs");
    onnx::NodeProto* mm = out.Add();
    mm->set_op_type("MatMul");
    mm->set_name(n.name());  // messages and units read the einsum's name
    mm->add_input(lhs);
    mm->add_input(rhs);
    mm->add_output(n.output(0));
    ++lowered;
  }
  if (lowered > 0) *g->mutable_node() = std::move(out);
  return lowered;
}

}  // namespace dlplan::onnx_import
