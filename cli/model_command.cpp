// `dlplan model`: write a model's IR JSON, from the zoo or a family builder.
//   dlplan model --zoo gpt2 --out models/gpt2.json
//   dlplan model gpt --layers 24 --hidden 1024 --heads 16 --out my-gpt.json
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/format.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/zoo.hpp"

#include <fmt/format.h>

#include <memory>

namespace dlplan::cli {
namespace {

struct ModelFlags {
  std::string family, zoo_name, name, out, blocks;
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, intermediate = 0, vocab = 0, context = 0, classes = 0;
  int image = 0, patch = 0;
  bool bottleneck = false;
};

template <typename T>
void set_if(T& field, T value) {
  if (value != T{}) field = value;
}

std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    std::string item = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    try {
      out.push_back(std::stoi(item));
    } catch (const std::exception&) {
      throw Error(fmt::format("--blocks '{}': expected integers separated by commas", s));
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

zoo::Json build(const ModelFlags& f) {
  const std::string name = f.name.empty() ? f.family : f.name;
  if (f.family == "gpt") {
    zoo::GptConfig c;
    c.name = name;
    set_if(c.layers, f.layers), set_if(c.hidden, f.hidden), set_if(c.heads, f.heads);
    set_if(c.vocab, f.vocab), set_if(c.context, f.context), set_if(c.mlp_hidden, f.intermediate);
    return zoo::build_gpt(c);
  }
  if (f.family == "llama") {
    zoo::LlamaConfig c;
    c.name = name;
    set_if(c.layers, f.layers), set_if(c.hidden, f.hidden), set_if(c.heads, f.heads), set_if(c.kv_heads, f.kv_heads);
    set_if(c.intermediate, f.intermediate), set_if(c.vocab, f.vocab), set_if(c.context, f.context);
    return zoo::build_llama(c);
  }
  if (f.family == "bert") {
    zoo::BertConfig c;
    c.name = name;
    set_if(c.layers, f.layers), set_if(c.hidden, f.hidden), set_if(c.heads, f.heads);
    set_if(c.intermediate, f.intermediate), set_if(c.vocab, f.vocab), set_if(c.context, f.context);
    set_if(c.classes, f.classes);
    return zoo::build_bert(c);
  }
  if (f.family == "vit") {
    zoo::VitConfig c;
    c.name = name;
    set_if(c.layers, f.layers), set_if(c.hidden, f.hidden), set_if(c.heads, f.heads);
    set_if(c.mlp_hidden, f.intermediate), set_if(c.classes, f.classes), set_if(c.image, f.image), set_if(c.patch, f.patch);
    return zoo::build_vit(c);
  }
  if (f.family == "resnet") {
    zoo::ResnetConfig c;
    c.name = name;
    if (!f.blocks.empty()) c.blocks = parse_int_list(f.blocks);
    c.bottleneck = f.bottleneck;
    set_if(c.width, f.hidden), set_if(c.classes, f.classes), set_if(c.image, f.image);
    return zoo::build_resnet(c);
  }
  if (f.family == "mlp") {
    zoo::MlpConfig c;
    c.name = name;
    if (f.hidden > 0) c.hidden.assign(static_cast<size_t>(std::max(f.layers, 1)), f.hidden);
    set_if(c.classes, f.classes);
    return zoo::build_mlp(c);
  }
  if (f.family == "cnn") {
    zoo::CnnConfig c;
    c.name = name;
    set_if(c.classes, f.classes), set_if(c.image, f.image);
    return zoo::build_cnn(c);
  }
  throw Error(fmt::format("unknown model family '{}' (choose one of: gpt, llama, bert, vit, resnet, mlp, cnn)", f.family));
}

}  // namespace

Runner add_model_command(CLI::App& app) {
  auto f = std::make_shared<ModelFlags>();
  app.add_option("family", f->family, "Family: gpt, llama, bert, vit, resnet, mlp, cnn");
  app.add_option("--zoo", f->zoo_name, "Write a zoo model instead (see `dlplan models`)");
  app.add_option("--name", f->name, "The model's name");
  app.add_option("--out", f->out, "Write the IR here (default: standard output)");
  app.add_option("--layers", f->layers, "Transformer layers (mlp: hidden layers)");
  app.add_option("--hidden", f->hidden, "Model width (resnet: stem width)");
  app.add_option("--heads", f->heads, "Attention heads");
  app.add_option("--kv-heads", f->kv_heads, "Key/value heads (llama: grouped-query attention)");
  app.add_option("--intermediate", f->intermediate, "MLP width");
  app.add_option("--vocab", f->vocab, "Vocabulary size");
  app.add_option("--context", f->context, "Sequence length and position table size");
  app.add_option("--classes", f->classes, "Classifier classes");
  app.add_option("--image", f->image, "Image size (square)");
  app.add_option("--patch", f->patch, "ViT patch size");
  app.add_option("--blocks", f->blocks, "ResNet blocks per stage, e.g. 3,4,6,3");
  app.add_flag("--bottleneck", f->bottleneck, "ResNet bottleneck blocks (resnet50 and up)");
  return [f]() {
    if (f->zoo_name.empty() == f->family.empty())
      throw Error("give either a family (dlplan model gpt --layers ...) or --zoo NAME");
    zoo::Json ir;
    if (!f->zoo_name.empty()) {
      auto z = zoo::zoo_model(f->zoo_name);
      if (!z) throw Error(fmt::format("'{}' is not a zoo model (see `dlplan models`)", f->zoo_name));
      ir = *z;
    } else {
      ir = build(*f);
    }
    Model m = parse_model(nlohmann::json(ir), f->out.empty() ? "<built model>" : f->out);  // validate before writing
    std::string text = ir.dump(1) + "\n";
    if (f->out.empty()) {
      fmt::print("{}", text);
    } else {
      write_file_atomically(f->out, text);
      fmt::print(stderr, "wrote {} ({} parameters)\n", f->out, format_count(m.parameter_count()));
    }
    return 0;
  };
}

}  // namespace dlplan::cli
