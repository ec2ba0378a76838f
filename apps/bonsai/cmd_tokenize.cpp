// `bonsai tokenize -m FILE -p TEXT [--special] [--no-bos]`: prints the token
// ids of TEXT as a JSON array, e.g. [9707,11,1879,0]. Like llama.cpp's
// llama-tokenize, BOS is prepended when the GGUF says add_bos_token (llama
// vocabularies; not Qwen) unless --no-bos. --special: special tokens written
// in TEXT (e.g. "<|im_start|>") are recognised; otherwise such text is
// tokenized as plain characters.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/bonsai/cli_common.h"  // init_runtime_or_report
#include "apps/bonsai/commands.h"
#include "gguf/gguf.h"            // gguf::File
#include "tokenizer/tokenizer.h"  // Tokenizer

namespace bonsai::app {

namespace {

struct TokenizeOptions {
  std::string model_path;
  std::string prompt;
  bool special = false;
  bool no_bos = false;
};

int run_tokenize(const TokenizeOptions& o) {
  // BONSAI_KERNEL: a usage error (exit 2), as in every command.
  if (!init_runtime_or_report("tokenize", RuntimeFlags{.size_global_pool = false})) return kExitUsage;
  auto file = gguf::File::open(o.model_path);
  if (!file) {
    std::cerr << "bonsai tokenize: " << file.error().message << "\n";
    return 1;
  }
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  if (!tok) {
    std::cerr << "bonsai tokenize: " << tok.error().message << "\n";
    return 1;
  }
  const auto ids = o.no_bos ? (*tok)->encode(o.prompt, o.special) : (*tok)->encode_prompt(o.prompt, o.special);
  std::cout << nlohmann::json(ids).dump() << "\n";
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  cmd->add_option("-m,--model", opts->model_path, "GGUF model file (its tokenizer is used)")->required();
  cmd->add_option("-p,--prompt", opts->prompt, "Text to tokenize")->required();
  cmd->add_flag("--special", opts->special, "Recognise special tokens (e.g. <|im_start|>) in the text");
  cmd->add_flag("--no-bos", opts->no_bos, "Do not prepend BOS even if the model asks for it");
  cmd->callback([opts] { set_exit_code(run_tokenize(*opts)); });
}

}  // namespace bonsai::app
