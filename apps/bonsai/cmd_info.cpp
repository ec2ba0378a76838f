// `bonsai info -m FILE [--json] [--q2-layout L]`: a GGUF dump. Text mode shows
// the file header, architecture and hyper-parameters (every "<arch>.*" key),
// a tokenizer summary, the other metadata, and the tensor table (name, ggml
// type, shape in GGUF ne order, bytes). --json prints one object:
//   {"file", "version", "alignment", "data_offset",
//    "metadata": {key: value}  (arrays summarised as
//                 {"type":"array","elem_type":"string","len":N}),
//    "tensors": [{"name","type","shape","offset","bytes"}]  (offset relative to
//                 the data section, as stored in the tensor info),
//    "q2_layout": "g64"|"g128-d-first"|"g128-qs-first"  (files with type-42 tensors only)}
// The Q2_0 layout is detected unless --q2-layout or env BONSAI_Q2_LAYOUT forces it.
// Errors print the message; a bad layout name or BONSAI_KERNEL exits 2, an
// unreadable/invalid file 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "apps/bonsai/cli_common.h"
#include "apps/bonsai/commands.h"
#include "apps/bonsai/hub_cli.h"  // -hf / -hff
#include "gguf/gguf.h"

namespace bonsai::app {
namespace {

using gguf::Array;
using gguf::Value;
using gguf::ValueType;

nlohmann::ordered_json value_to_json(const Value& v) {
  if (const auto* a = std::get_if<Array>(&v.v)) {
    return {
        {"type", "array"}, {"elem_type", std::string(gguf::value_type_name(a->elem_type))}, {"len", a->items.size()}};
  }
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.v)) return *i;
  if (const auto* d = std::get_if<double>(&v.v)) return *d;
  if (const auto* b = std::get_if<bool>(&v.v)) return *b;
  return std::string(std::get<std::string_view>(v.v));
}

// One-line rendering for text mode: strings quoted and cut at `max_chars` with
// control characters escaped; arrays as "[string x N]".
std::string value_to_text(const Value& v, size_t max_chars = 72) {
  if (const auto* a = std::get_if<Array>(&v.v)) {
    return "[" + std::string(gguf::value_type_name(a->elem_type)) + " x " + std::to_string(a->items.size()) + "]";
  }
  if (const auto* s = std::get_if<std::string_view>(&v.v)) {
    std::string out = "\"";
    size_t n = 0;
    for (char c : *s) {
      if (n++ >= max_chars) {
        out += "...\" (" + std::to_string(s->size()) + " bytes)";
        return out;
      }
      if (c == '\n')
        out += "\\n";
      else if (c == '\t')
        out += "\\t";
      else if (c == '"')
        out += "\\\"";
      else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F)
        out += "?";
      else
        out += c;
    }
    return out + "\"";
  }
  if (const auto* d = std::get_if<double>(&v.v)) {
    std::ostringstream os;
    os << *d;
    return os.str();
  }
  return value_to_json(v).dump();
}

// A key or tensor name from the file, for the terminal: control characters
// (ESC sequences could restyle or rewrite the user's terminal) become '?'.
std::string printable(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) c = '?';
  }
  return out;
}

std::string shape_text(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

nlohmann::ordered_json file_to_json(const gguf::File& f) {
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const gguf::KeyValue& kv : f.metadata()) meta[std::string(kv.key)] = value_to_json(kv.value);
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const gguf::TensorInfo& t : f.tensors()) {
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
    tensors.push_back({{"name", std::string(t.name)},
                       {"type", core::ggml_type_name(t.type_id)},
                       {"shape", shape},
                       {"offset", t.offset},
                       {"bytes", t.n_bytes}});
    if (f.is_split()) tensors.back()["part"] = t.part + 1;  // 1-based, as the part names count
  }
  nlohmann::ordered_json j = {{"file", f.path()},
                              {"size", f.total_bytes()},
                              {"version", f.version()},
                              {"alignment", f.alignment()},
                              {"data_offset", f.data_offset()}};
  if (f.is_split()) {
    nlohmann::ordered_json parts = nlohmann::ordered_json::array();
    for (const gguf::Part& p : f.parts())
      parts.push_back({{"file", p.mapping->path()},
                       {"size", p.mapping->size()},
                       {"version", p.version},
                       {"alignment", p.alignment},
                       {"data_offset", p.data_offset},
                       {"tensors", p.n_tensors}});
    j["parts"] = parts;
  }
  j["metadata"] = meta;
  j["tensors"] = tensors;
  if (f.q2_layout()) j["q2_layout"] = std::string(core::q2_layout_name(*f.q2_layout()));
  return j;
}

void print_text(const gguf::File& f, std::ostream& os) {
  uint64_t data_bytes = 0;
  for (const auto& t : f.tensors()) data_bytes += t.n_bytes;
  os << "file:          " << f.path() << "\n"
     << "format:        GGUF v" << f.version() << ", alignment " << f.alignment() << ", data at offset "
     << f.data_offset() << ", " << f.metadata().size() << " metadata keys, " << f.tensors().size() << " tensors ("
     << data_bytes << " bytes)\n";
  if (f.is_split()) {
    os << "split:         " << f.parts().size() << " parts, " << f.total_bytes() << " bytes\n";
    for (const gguf::Part& p : f.parts())
      os << "  " << p.mapping->path() << " (" << p.mapping->size() << " bytes, " << p.n_tensors << " tensors)\n";
  }
  const std::string arch = std::string(f.get<std::string_view>("general.architecture").value_or("(unknown)"));
  os << "architecture:  " << printable(arch) << "\n";
  if (auto name = f.get<std::string_view>("general.name")) {
    os << "name:          " << printable(*name) << "\n";
  }
  if (f.q2_layout()) os << "q2 layout:     " << core::q2_layout_name(*f.q2_layout()) << "\n";

  os << "\nhyper-parameters:\n";
  const std::string prefix = arch + ".";
  for (const auto& kv : f.metadata()) {
    if (kv.key.starts_with(prefix)) {
      os << "  " << std::left << std::setw(44) << printable(kv.key.substr(prefix.size())) << value_to_text(kv.value)
         << "\n";
    }
  }

  os << "\ntokenizer:\n";
  if (!f.has("tokenizer.ggml.model")) {
    os << "  (none)\n";
  } else {
    auto show = [&](const char* label, std::string_view key) {
      if (const Value* v = f.find(key)) os << "  " << std::left << std::setw(20) << label << value_to_text(*v) << "\n";
    };
    show("model", "tokenizer.ggml.model");
    show("pre", "tokenizer.ggml.pre");
    if (auto toks = f.get_string_array("tokenizer.ggml.tokens")) {
      os << "  " << std::left << std::setw(20) << "tokens" << toks->size() << "\n";
    }
    if (auto types = f.get_i32_array("tokenizer.ggml.token_type")) {
      size_t counts[7] = {};
      for (int32_t t : *types) counts[(t >= 1 && t <= 6) ? t : 0]++;
      os << "  " << std::left << std::setw(20) << "token types" << counts[1] << " normal, " << counts[3] << " control, "
         << counts[4] << " user-defined, " << counts[5] << " unused, " << counts[6] << " byte, " << counts[2]
         << " unknown";
      if (counts[0]) os << ", " << counts[0] << " other";
      os << "\n";
    }
    if (const Value* m = f.find("tokenizer.ggml.merges")) {
      if (const auto* a = std::get_if<Array>(&m->v)) {
        os << "  " << std::left << std::setw(20) << "merges" << a->items.size() << "\n";
      }
    }
    auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    for (const char* id_key : {"bos", "eos", "eot", "padding", "unknown", "seperator"}) {
      const std::string key = std::string("tokenizer.ggml.") + id_key + "_token_id";
      if (auto id = f.get<int64_t>(key)) {
        os << "  " << std::left << std::setw(20) << (std::string(id_key) + " id") << *id;
        if (tokens && *id >= 0 && static_cast<uint64_t>(*id) < tokens->size()) {
          os << " " << value_to_text(Value{ValueType::kString, (*tokens)[static_cast<size_t>(*id)]});
        }
        os << "\n";
      }
    }
    show("add_bos_token", "tokenizer.ggml.add_bos_token");
    show("add_eos_token", "tokenizer.ggml.add_eos_token");
    if (auto tmpl = f.get<std::string_view>("tokenizer.chat_template")) {
      os << "  " << std::left << std::setw(20) << "chat template" << tmpl->size() << " bytes\n";
    }
  }

  os << "\nother metadata:\n";
  for (const auto& kv : f.metadata()) {
    if (kv.key.starts_with(prefix) || kv.key.starts_with("tokenizer.")) continue;
    os << "  " << std::left << std::setw(44) << printable(kv.key) << value_to_text(kv.value) << "\n";
  }

  size_t name_w = 4;
  for (const auto& t : f.tensors()) name_w = std::max(name_w, t.name.size());
  os << "\ntensors:\n  " << std::left << std::setw(static_cast<int>(name_w) + 2) << "name" << std::setw(8) << "type"
     << std::setw(24) << "shape" << std::right << std::setw(14) << "bytes"
     << "\n";
  for (const auto& t : f.tensors()) {
    os << "  " << std::left << std::setw(static_cast<int>(name_w) + 2) << printable(t.name) << std::setw(8)
       << core::ggml_type_name(t.type_id) << std::setw(24) << shape_text(t) << std::right << std::setw(14) << t.n_bytes
       << "\n";
  }
}

}  // namespace

void register_info(CLI::App& app) {
  struct Options {
    std::string model;
    HfFlags hf;
    bool json = false;
    std::string q2_layout;
  };
  auto opt = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("info", "Show a GGUF file's metadata, tokenizer summary and tensors");
  cmd->add_option("-m,--model", opt->model, "GGUF file");
  add_hf_flags(cmd, opt->hf);
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of text");
  cmd->add_option("--q2-layout", opt->q2_layout,
                  "Layout of type-42 (Q2_0) tensors: g64|g128-d-first|g128-qs-first (default: detect; "
                  "env BONSAI_Q2_LAYOUT)");
  cmd->callback([opt] {
    // BONSAI_KERNEL, --q2-layout: usage errors (exit 2), as in every command.
    const auto rt =
        init_runtime_or_report("info", RuntimeFlags{.size_global_pool = false, .q2_layout = opt->q2_layout});
    if (!rt) {
      set_exit_code(kExitUsage);
      return;
    }
    if (hf_conflicts_with_m("info", opt->hf, !opt->model.empty())) return set_exit_code(kExitUsage);
    if (opt->model.empty() && opt->hf.repo.empty()) {
      std::cerr << "bonsai info: give a model: -m FILE or -hf OWNER/NAME[:QUANT]\n";
      return set_exit_code(kExitUsage);
    }
    if (!opt->hf.repo.empty()) {
      auto p = resolve_hf_model("info", opt->hf.repo, opt->hf.file);
      if (!p) return set_exit_code(1);
      opt->model = *p;
    }
    auto f = gguf::File::open(opt->model, rt->open_options.file);
    if (!f) {
      std::cerr << "bonsai info: " << f.error().message << "\n";
      set_exit_code(1);
      return;
    }
    if (opt->json) {
      std::cout << file_to_json(**f).dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    } else {
      print_text(**f, std::cout);
    }
  });
}

}  // namespace bonsai::app
