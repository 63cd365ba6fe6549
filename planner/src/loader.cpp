// JSON IR -> Model: structure checks, attribute checks (ops_schema.cpp), a
// Boost.Graph of the data flow for cycle detection and topological order, and
// shape inference in that order.
#include "dlplan/loader.hpp"

#include "dlplan/error.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/ops.hpp"
#include "dlplan/zoo.hpp"

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <boost/graph/topological_sort.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

namespace dlplan {
namespace {

using Json = nlohmann::json;
using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS>;

[[noreturn]] void fail(const std::string& src, const std::string& msg) { throw Error(fmt::format("{}: {}", src, msg)); }

std::string node_label(const Json& node, size_t i) {
  if (node.is_object() && node.contains("name") && node["name"].is_string())
    return fmt::format("node '{}'", node["name"].get<std::string>());
  return fmt::format("node #{}", i);
}

// Records the first back edge DFS meets: an edge that closes a cycle.
struct CycleFinder : boost::default_dfs_visitor {
  std::vector<std::pair<size_t, size_t>>* back;
  void back_edge(Graph::edge_descriptor e, const Graph& g) const {
    if (back->empty()) back->emplace_back(boost::source(e, g), boost::target(e, g));
  }
};

void parse_inputs(const Json& ir, const std::string& src, Model& m) {
  if (!ir.contains("inputs") || !ir["inputs"].is_object() || ir["inputs"].empty())
    fail(src, "'inputs' must be a non-empty object of {name: {\"shape\": [...], \"dtype\": ...}}");
  if (static_cast<int64_t>(ir["inputs"].size()) > kMaxNodes)
    fail(src, fmt::format("{} inputs are more than dlplan's limit of {}", ir["inputs"].size(), kMaxNodes));
  for (const auto& [name, spec] : ir["inputs"].items()) {
    auto where = fmt::format("input '{}'", name);
    if (!spec.is_object()) fail(src, where + " must be an object with 'shape' and 'dtype'");
    for (const auto& [key, v] : spec.items())
      if (key != "shape" && key != "dtype") fail(src, fmt::format("{}: unknown field '{}'", where, key));
    if (!spec.contains("shape") || !spec["shape"].is_array()) fail(src, where + ": 'shape' must be an array of positive integers");
    TensorInfo t;
    t.name = name;
    int64_t elems = 1;
    for (const auto& d : spec["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0)
        fail(src, fmt::format("{}: shape {} must hold positive integers", where, spec["shape"].dump()));
      if (elems > (int64_t{1} << 48) / d.get<int64_t>()) fail(src, where + ": shape is too large (more than 2^48 elements)");
      elems *= d.get<int64_t>();
      t.shape.push_back(d.get<int64_t>());
    }
    // Check the type before reading: a number here must not escape as a json type_error.
    if (!spec.contains("dtype") || !spec["dtype"].is_string() ||
        (spec["dtype"].get<std::string>() != "f32" && spec["dtype"].get<std::string>() != "i32"))
      fail(src, fmt::format("{}: 'dtype' must be \"f32\" or \"i32\", got {}", where,
                            spec.contains("dtype") ? spec["dtype"].dump() : std::string("nothing")));
    const std::string dtype = spec["dtype"].get<std::string>();
    t.dtype = dtype == "f32" ? DType::f32 : DType::i32;
    m.inputs.push_back(static_cast<int>(m.tensors.size()));
    m.tensors.push_back(std::move(t));
  }
}

// The nodes' structure: name, op, in, unit. Returns the raw node objects.
std::vector<Node> parse_node_headers(const Json& ir, const std::string& src, const Model& m,
                                     std::map<std::string, int>& node_by_name) {
  if (!ir.contains("nodes") || !ir["nodes"].is_array() || ir["nodes"].empty())
    fail(src, "'nodes' must be a non-empty array");
  if (static_cast<int64_t>(ir["nodes"].size()) > kMaxNodes)
    fail(src, fmt::format("{} nodes are more than dlplan's limit of {}", ir["nodes"].size(), kMaxNodes));
  std::set<std::string> input_names;
  for (int id : m.inputs) input_names.insert(m.tensor(id).name);
  std::vector<Node> nodes;
  const auto& arr = ir["nodes"];
  for (size_t i = 0; i < arr.size(); ++i) {
    const Json& j = arr[i];
    auto label = node_label(j, i);
    if (!j.is_object()) fail(src, label + " must be an object");
    if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
      fail(src, label + ": 'name' must be a non-empty string");
    Node n;
    n.name = j["name"].get<std::string>();
    if (input_names.count(n.name)) fail(src, fmt::format("{}: duplicate name (a model input has it too)", label));
    if (!node_by_name.emplace(n.name, static_cast<int>(i)).second) fail(src, label + ": duplicate node name");
    if (!j.contains("op") || !j["op"].is_string()) fail(src, label + ": 'op' must be a string");
    if (!op_from_string(j["op"].get<std::string>(), n.op))
      fail(src, fmt::format("{}: unknown op '{}' (known: {})", label, j["op"].get<std::string>(), fmt::join(op_names(), ", ")));
    if (!j.contains("in") || !j["in"].is_array()) fail(src, label + ": 'in' must be an array of input names");
    if (op_input_count(n.op) == kVariadic) {
      if (j["in"].empty()) fail(src, fmt::format("{} ({}): takes one or more inputs, got none", label, to_string(n.op)));
    } else if (const size_t want = static_cast<size_t>(op_input_count(n.op)); j["in"].size() != want) {
      fail(src, fmt::format("{} ({}): takes {} input{}, got {}", label, to_string(n.op), want, want == 1 ? "" : "s", j["in"].size()));
    }
    for (const auto& e : j["in"])
      if (!e.is_string()) fail(src, fmt::format("{}: 'in' entries must be strings, got {}", label, e.dump()));
    if (j.contains("unit") && !(j["unit"].is_string() && !j["unit"].get<std::string>().empty()))
      fail(src, label + ": 'unit' must be a non-empty string");
    nodes.push_back(std::move(n));
  }
  return nodes;
}

// Node order for shape inference and execution: the file's order when it is
// already topological (the order the author wrote), else Boost's topological
// order. A cycle is an error naming two of its nodes.
std::vector<size_t> topological_order(const Json& arr, const std::string& src, const std::vector<Node>& nodes,
                                      const std::map<std::string, int>& node_by_name, const Model& m) {
  const size_t n = nodes.size();
  Graph g(n);
  bool file_order_ok = true;
  for (size_t i = 0; i < n; ++i)
    for (const auto& e : arr[i]["in"]) {
      auto name = e.get<std::string>();
      auto it = node_by_name.find(name);
      if (it == node_by_name.end()) {
        bool is_input = false;
        for (int id : m.inputs) is_input |= m.tensor(id).name == name;
        if (!is_input)
          fail(src, fmt::format("node '{}': input '{}' is neither a model input nor a node", nodes[i].name, name));
        continue;
      }
      size_t from = static_cast<size_t>(it->second);
      if (from == i) fail(src, fmt::format("node '{}': takes its own output as input (a cycle)", nodes[i].name));
      boost::add_edge(from, i, g);
      if (from > i) file_order_ok = false;
    }
  std::vector<std::pair<size_t, size_t>> back;
  boost::depth_first_search(g, boost::visitor(CycleFinder{{}, &back}));
  if (!back.empty())
    fail(src, fmt::format("cycle: node '{}' feeds node '{}', which already depends on it", nodes[back[0].first].name,
                          nodes[back[0].second].name));
  std::vector<size_t> order;
  if (file_order_ok) {
    for (size_t i = 0; i < n; ++i) order.push_back(i);
  } else {
    std::vector<Graph::vertex_descriptor> rev;
    boost::topological_sort(g, std::back_inserter(rev));
    order.assign(rev.rbegin(), rev.rend());
  }
  return order;
}

// Every node must lead to the loss. A node whose output nothing uses would get
// no gradient in backward (the trainer would have nothing to run its backward
// on), and the plan would count memory and time the model does not spend as
// written; the author most likely meant something else, so it is refused
// rather than silently dropped. Nodes are in topological order: walking back
// from the end marks every node the loss depends on.
void check_every_node_reaches_the_loss(const Model& m, const std::string& src) {
  std::vector<bool> live(m.nodes.size(), false);
  for (size_t i = 0; i < m.nodes.size(); ++i) live[i] = m.nodes[i].op == OpKind::cross_entropy;
  for (size_t i = m.nodes.size(); i-- > 0;) {
    if (!live[i]) continue;
    for (int t : m.nodes[i].inputs)
      if (const int p = m.tensor(t).producer; p >= 0) live[static_cast<size_t>(p)] = true;
  }
  std::vector<std::string> dead;
  for (size_t i = 0; i < m.nodes.size(); ++i)
    if (!live[i]) dead.push_back(fmt::format("'{}' ({})", m.nodes[i].name, to_string(m.nodes[i].op)));
  if (dead.empty()) return;
  const size_t shown = std::min<size_t>(dead.size(), 5);
  fail(src, fmt::format("node {} does not lead to the loss: nothing uses its output on the way to the cross_entropy "
                        "node, so it would get no gradient{}; remove it or connect it",
                        dead[0],
                        dead.size() == 1 ? std::string()
                                         : fmt::format(" ({} such nodes: {}{})", dead.size(),
                                                       fmt::join(dead.begin(), dead.begin() + static_cast<long>(shown), ", "),
                                                       dead.size() > shown ? ", ..." : "")));
}

// The model-wide limits (dlplan/limits.hpp), summed in double so that the
// sums themselves cannot overflow: what the step program later multiplies by
// the micro-batch then stays within 64 bits.
void check_model_limits(const Model& m, const std::string& src) {
  double params = 0;
  for (const auto& p : m.params) params += static_cast<double>(p.numel);
  for (const auto& b : m.buffers) params += static_cast<double>(b.numel);
  if (params > static_cast<double>(kMaxParameters))
    fail(src, fmt::format("the model has {:.4g} parameters and buffers, more than dlplan's limit of 2^44", params));
  const double elements = sample_elements(m);
  if (elements > static_cast<double>(kMaxSampleElements))
    fail(src, fmt::format("one sample's tensors hold {:.4g} elements, more than dlplan's limit of 2^48", elements));
}

// `shares`: the node applies the parameters of an earlier node (ALBERT runs
// one layer's weights at every depth). That node must be the same op with the
// same attributes and parameters of the same shapes, and own them (not share
// them itself); ops with buffers (batch norm's running statistics) do not
// share.
void check_shares(const Model& m, const Node& n, const std::string& src) {
  auto bad = [&](const std::string& why) { fail(src, fmt::format("node '{}' ({}): {}", n.name, to_string(n.op), why)); };
  const std::string target = n.attrs.text("shares");
  const int t = m.node_index(target);
  if (t < 0 || target == n.name) bad(fmt::format("shares names '{}', which is not a node before this one", target));
  const Node& owner = m.nodes[static_cast<size_t>(t)];
  if (owner.attrs.has("shares"))
    bad(fmt::format("shares names '{}', which itself applies the parameters of '{}'; name that node", target,
                    owner.attrs.text("shares")));
  if (owner.op != n.op) bad(fmt::format("shares names '{}', which is a {}, not a {}", target, to_string(owner.op), to_string(n.op)));
  if (n.attrs.has("tie") || owner.attrs.has("tie")) bad("a node cannot both share and tie parameters");
  Node own = n;
  own.attrs.values.erase("shares");
  if (own.attrs.values != owner.attrs.values)
    bad(fmt::format("shares the parameters of '{}', whose attributes differ ({} against {})", target,
                    nlohmann::json(own.attrs.values).dump(), nlohmann::json(owner.attrs.values).dump()));
  const OpDecl mine = declare(m, own), theirs = declare(m, owner);
  if (mine.params.empty()) bad("shares parameters but has none");
  if (!mine.buffers.empty()) bad("keeps buffers (running statistics), which dlplan does not share between nodes");
  auto shapes = [](const OpDecl& d) {
    std::vector<std::pair<std::string, Shape>> v;
    for (const auto& p : d.params) v.emplace_back(p.suffix, p.shape);
    return v;
  };
  if (shapes(mine) != shapes(theirs))
    bad(fmt::format("shares the parameters of '{}', whose shapes differ (its inputs have other shapes)", target));
}

}  // namespace

void collect_params(Model& m) {
  m.params.clear();
  m.buffers.clear();
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    const Node& n = m.nodes[i];
    OpDecl d = declare(m, n);
    for (const auto& p : d.params) {
      m.params.push_back({n.name + "." + p.suffix, static_cast<int>(i), n.unit, p.numel, p.weight_decay, p.shape});
      m.params.back().adapter = p.adapter;
    }
    for (const auto& b : d.buffers)
      m.buffers.push_back({n.name + "." + b.suffix, static_cast<int>(i), n.unit, b.numel, false, b.shape});
  }
}


Model parse_model(const Json& ir, const std::string& src) {
  if (!ir.is_object()) fail(src, "the model must be a JSON object with 'name', 'inputs' and 'nodes'");
  for (const auto& [key, v] : ir.items())
    if (key != "name" && key != "inputs" && key != "nodes") fail(src, fmt::format("unknown top-level field '{}'", key));
  Model m;
  m.source = src;
  m.name = ir.contains("name") && ir["name"].is_string() ? ir["name"].get<std::string>()
                                                         : std::filesystem::path(src).stem().string();
  parse_inputs(ir, src, m);
  std::map<std::string, int> node_by_name;
  std::vector<Node> headers = parse_node_headers(ir, src, m, node_by_name);
  const auto& arr = ir["nodes"];
  std::vector<size_t> order = topological_order(arr, src, headers, node_by_name, m);

  std::map<std::string, int> tensor_by_name;
  for (int id : m.inputs) tensor_by_name[m.tensor(id).name] = id;
  m.units = {""};
  for (size_t pos : order) {
    Node n = headers[pos];
    const Json& raw = arr[pos];
    for (const auto& e : raw["in"]) n.inputs.push_back(tensor_by_name.at(e.get<std::string>()));
    if (raw.contains("unit")) {
      auto u = raw["unit"].get<std::string>();
      auto it = std::find(m.units.begin(), m.units.end(), u);
      n.unit = static_cast<int>(it - m.units.begin());
      if (it == m.units.end()) m.units.push_back(u);
    }
    check_and_fill_attrs(n, raw, src);
    TensorInfo out = infer_output(m, n, src);
    out.producer = static_cast<int>(m.nodes.size());
    n.output = static_cast<int>(m.tensors.size());
    tensor_by_name[n.name] = n.output;
    m.tensors.push_back(std::move(out));
    m.nodes.push_back(std::move(n));
    if (m.nodes.back().attrs.has("shares")) check_shares(m, m.nodes.back(), src);
  }
  // Tied and shared parameters belong to the root unit: every user needs
  // them gathered.
  for (auto& n : m.nodes)
    for (const char* key : {"tie", "shares"})
      if (n.attrs.has(key)) m.nodes[static_cast<size_t>(m.node_index(n.attrs.text(key)))].unit = 0;

  std::vector<std::string> losses;
  for (const auto& n : m.nodes)
    if (n.op == OpKind::cross_entropy) losses.push_back("'" + n.name + "'");
  if (losses.size() != 1)
    fail(src, fmt::format("a model needs exactly one cross_entropy loss node, found {}{}", losses.size(),
                          losses.empty() ? std::string() : fmt::format(" ({})", fmt::join(losses, ", "))));
  check_every_node_reaches_the_loss(m, src);
  collect_params(m);
  check_model_limits(m, src);

  // The IR as planned: every default explicit, nodes in execution order.
  m.ir = nlohmann::ordered_json::object();
  m.ir["name"] = m.name;
  m.ir["inputs"] = nlohmann::ordered_json::object();
  for (int id : m.inputs) {
    const auto& t = m.tensor(id);
    m.ir["inputs"][t.name] = {{"shape", t.shape}, {"dtype", to_string(t.dtype)}};
  }
  m.ir["nodes"] = nlohmann::ordered_json::array();
  for (const auto& n : m.nodes) {
    nlohmann::ordered_json j = {{"name", n.name}, {"op", to_string(n.op)}, {"in", nlohmann::ordered_json::array()}};
    for (int id : n.inputs) j["in"].push_back(m.tensor(id).name);
    for (const auto& [k, v] : n.attrs.values.items())
      if (!v.is_null()) j[k] = v;
    if (const auto& raw = arr[static_cast<size_t>(node_by_name.at(n.name))]; raw.contains("unit")) j["unit"] = raw["unit"];
    m.ir["nodes"].push_back(std::move(j));
  }
  return m;
}

namespace {

bool has_extension(const std::string& path, const char* ext) {
  auto e = std::filesystem::path(path).extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return e == ext;
}

}  // namespace

Model load_model_file(const std::string& path) { return parse_model(read_json_file(path, "model file"), path); }

Model load_model(const std::string& name_or_path) { return load_model(name_or_path, ImportOptions{}); }

Model load_model(const std::string& name_or_path, const ImportOptions& opt) {
  if (auto ir = zoo::zoo_model(name_or_path)) return parse_model(Json(*ir), name_or_path);
  if (std::filesystem::exists(name_or_path)) {
    if (has_extension(name_or_path, ".onnx")) return import_onnx(name_or_path, opt);
    Json doc = read_json_file(name_or_path, "model file");
    if (is_hf_config(doc)) {
      std::vector<std::string> notes;
      Model m = parse_model(Json(hf_config_to_ir(doc, name_or_path, &notes, opt)), name_or_path);
      m.notes = std::move(notes);
      return m;
    }
    return parse_model(doc, name_or_path);
  }
  std::vector<std::string> names;
  for (const auto& e : zoo::zoo_entries()) names.push_back(e.name);
  throw Error(fmt::format("{}: no such file, and not a zoo model (zoo: {})", name_or_path, fmt::join(names, ", ")));
}

int64_t tokens_per_sample(const Model& m) {
  for (int id : m.inputs) {
    const auto& t = m.tensor(id);
    // An encoder-decoder's decoder tokens are --decoder-seq-len's, not this.
    if (t.dtype == DType::i32 && t.shape.size() == 1 && t.name != kDecoderInputIds) return t.shape[0];
  }
  return 0;
}

namespace {

// `m` changed as `ir` says, loaded anew (shapes, derived attributes, units),
// with what loading `m` noted.
Model reloaded(const Model& m, const Json& ir) {
  Model out = parse_model(ir, m.source);
  out.notes = m.notes;
  out.unaccounted_bytes = m.unaccounted_bytes;
  return out;
}

}  // namespace

Model with_seq_len(const Model& m, int64_t seq_len) {
  if (seq_len <= 0) throw Error(fmt::format("{}: --seq-len must be positive, got {}", m.source, seq_len));
  if (tokens_per_sample(m) == 0)
    throw Error(fmt::format("{}: the model has no token inputs ([T] i32), so --seq-len does not apply", m.source));
  if (has_extension(m.source, ".onnx")) {
    // Imported with ImportOptions::seq_len, the file's symbolic sequence
    // dims hold it already, and the loss targets the importer added follow
    // the logits, which need not be the input's length (a decoder that
    // upsamples, as Funnel's, has twice as many): left as they are. A file
    // that fixes another length is resized below like any model.
    const auto& inputs = m.ir["inputs"].items();
    if (std::all_of(inputs.begin(), inputs.end(), [&](const auto& in) {
          const Json& spec = in.value();
          return in.key() == "targets" || spec["dtype"] != "i32" || spec["shape"].size() != 1 || spec["shape"][0] == seq_len;
        }))
      return m;
  }
  Json ir = m.ir;
  for (auto& [name, spec] : ir["inputs"].items())
    if (spec["dtype"] == "i32" && spec["shape"].size() == 1) spec["shape"][0] = seq_len;
  // An expert's places are a share of the sample's tokens: derived anew from
  // its capacity_factor at the new length.
  for (auto& node : ir["nodes"])
    if (node.value("op", "") == "moe_expert" || node.value("op", "") == "moe_combine") node.erase("capacity");
  return reloaded(m, ir);
}

Model with_decoder_seq_len(const Model& m, int64_t tokens) {
  if (tokens <= 0) throw Error(fmt::format("{}: --decoder-seq-len must be positive, got {}", m.source, tokens));
  Json ir = m.ir;
  if (!ir["inputs"].contains(kDecoderInputIds))
    throw Error(fmt::format("{}: the model has no decoder (no input named decoder_input_ids), so --decoder-seq-len does "
                            "not apply", m.source));
  std::vector<std::string> decoder_inputs = {kDecoderInputIds};
  for (const auto& n : m.nodes)
    if (n.op == OpKind::cross_entropy) decoder_inputs.push_back(m.tensor(n.inputs[1]).name);
  for (const auto& name : decoder_inputs) {
    if (!ir["inputs"].contains(name)) continue;  // targets computed in the graph, not fed: nothing to resize
    auto& spec = ir["inputs"][name];
    if (spec.contains("shape") && spec["dtype"] == "i32" && spec["shape"].size() == 1) spec["shape"][0] = tokens;
  }
  return reloaded(m, ir);
}

Model with_capacity_factor(const Model& m, double capacity_factor) {
  if (!(capacity_factor > 0) || !std::isfinite(capacity_factor))
    throw Error(fmt::format("{}: --capacity-factor must be positive, got {}", m.source, capacity_factor));
  Json ir = m.ir;
  int combines = 0;
  for (auto& node : ir["nodes"]) {
    const std::string op = node.value("op", "");
    if (op != "moe_expert" && op != "moe_combine") continue;
    node["capacity_factor"] = capacity_factor;
    node.erase("capacity");
    combines += op == "moe_combine";
  }
  if (combines == 0)
    throw Error(fmt::format("{}: the model has no mixture of experts (moe_combine node), so --capacity-factor does not "
                            "apply", m.source));
  return reloaded(m, ir);
}

Model with_expert_units(const Model& m) {
  Json ir = m.ir;
  int experts = 0;
  for (auto& node : ir["nodes"])
    if (node.value("op", "") == "moe_expert") {
      node["unit"] = node["name"];
      ++experts;
    }
  if (experts == 0)
    throw Error(fmt::format("{}: the model has no mixture of experts (moe_expert nodes), so --expert-units does not "
                            "apply", m.source));
  return reloaded(m, ir);
}

}  // namespace dlplan
