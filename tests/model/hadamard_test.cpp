// model::read_hadamard_fold: the Bonsai 2 `prism.hadamard.*` keys of the
// shared micro fixtures (../shared/fixtures/README.md "The Bonsai 2 Hadamard
// fold"): the valid file read, each of the 16 malformed variants refused
// with an error naming the offending key, files without the keys -> nullopt;
// plus hand-made files (gguf::Writer) for the rules no fixture covers.
#include "model/hadamard.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/mapped_file.h"
#include "gguf/gguf.h"

namespace bonsai::model {
namespace {

std::string micro(const std::string& name) { return test::shared_path("fixtures/qwen35/malformed/" + name); }

std::shared_ptr<const gguf::File> open_or_fail(const std::string& path) {
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  return f ? *f : nullptr;
}

TEST(HadamardFoldTest, ValidMicroFileIsRead) {
  const std::string path = micro("qwen35-micro-bonsai2-ok.gguf");
  BONSAI_REQUIRE_FILE(path);
  auto f = open_or_fail(path);
  ASSERT_TRUE(f);
  auto fold = read_hadamard_fold(*f);
  ASSERT_TRUE(fold.has_value()) << fold.error().message;
  ASSERT_TRUE(fold->has_value());
  const HadamardFold& h = **fold;
  EXPECT_EQ(h.version, 1u);
  EXPECT_EQ(h.block, 64);
  EXPECT_EQ(h.sign_mode, HadamardFold::SignMode::kExplicit);
  ASSERT_EQ(h.signs.size(), 1u);
  ASSERT_TRUE(h.signs.contains(128));
  EXPECT_EQ(h.signs_for(128).size(), 128u);
  EXPECT_TRUE(h.signs_for(256).empty());
  for (float s : h.signs.at(128)) EXPECT_TRUE(s == 1.0f || s == -1.0f);
  // output.weight; layer 0 (GDN): attn_qkv, attn_gate, ssm_out, ffn_gate/up/down;
  // layer 1 (full attention): attn_q/k/v/output, ffn_gate/up/down.
  EXPECT_EQ(h.weight_names.size(), 14u);
  for (const char* n : {"output.weight", "blk.0.attn_qkv.weight", "blk.0.ssm_out.weight", "blk.1.attn_q.weight",
                        "blk.1.attn_output.weight", "blk.1.ffn_down.weight"}) {
    EXPECT_TRUE(h.folded(n)) << n;
  }
  EXPECT_FALSE(h.folded("blk.0.ssm_alpha.weight"));
  EXPECT_FALSE(h.folded("token_embd.weight"));
  EXPECT_TRUE(h.inverted("token_embd.weight"));
  EXPECT_EQ(h.inverse_names.size(), 1u);
  EXPECT_TRUE(h.gdn_v_grouped);
  EXPECT_EQ(describe(h), "block 64, sign widths [128], 14 folded matrices, inverse [token_embd.weight], gdn_v_grouped");
}

// Each malformed variant and the key its error must name.
struct Bad {
  const char* variant;
  const char* key;
};
constexpr Bad kBad[] = {
    {"version", "prism.hadamard.version"},
    {"block_not_pow2", "prism.hadamard.block_size"},
    {"block_not_dividing", "prism.hadamard.block_size"},
    {"transform", "prism.hadamard.transform"},
    {"axis", "prism.hadamard.axis"},
    {"sign_mode", "prism.hadamard.sign_mode"},
    {"sign_count_short", "prism.hadamard.sign_values"},
    {"sign_value_zero", "prism.hadamard.sign_values"},
    {"sign_value_two", "prism.hadamard.sign_values"},
    {"sign_width_dup", "prism.hadamard.sign_widths"},
    {"sign_width_missing", "prism.hadamard.sign_widths"},
    {"name_unknown", "prism.hadamard.weight_names"},
    {"name_not_foldable", "prism.hadamard.weight_names"},
    {"name_dup", "prism.hadamard.weight_names"},
    {"inverse_bad", "prism.hadamard.inverse_weight_names"},
    {"gdn_not_bool", "prism.hadamard.gdn_v_grouped"},
};

TEST(HadamardFoldTest, EveryMalformedVariantIsRefusedNamingItsKey) {
  for (const Bad& b : kBad) {
    SCOPED_TRACE(b.variant);
    const std::string path = micro(std::string("qwen35-micro-bonsai2-bad-") + b.variant + ".gguf");
    BONSAI_REQUIRE_FILE(path);
    auto f = open_or_fail(path);  // the GGUF itself is well-formed
    ASSERT_TRUE(f);
    auto fold = read_hadamard_fold(*f);
    ASSERT_FALSE(fold.has_value()) << "accepted " << path;
    EXPECT_EQ(fold.error().code, core::Errc::kFormat);
    EXPECT_NE(fold.error().message.find(b.key), std::string::npos) << fold.error().message;
    EXPECT_NE(fold.error().message.find(path), std::string::npos) << fold.error().message;
  }
}

TEST(HadamardFoldTest, FilesWithoutTheKeysHaveNoFold) {
  for (const char* rel : {"fixtures/qwen35/qwen35-tiny-pq2_0.gguf", "fixtures/qwen3-tiny-q2_0.gguf"}) {
    const std::string path = test::shared_path(rel);
    BONSAI_REQUIRE_FILE(path);
    auto f = open_or_fail(path);
    ASSERT_TRUE(f);
    auto fold = read_hadamard_fold(*f);
    ASSERT_TRUE(fold.has_value()) << fold.error().message;
    EXPECT_FALSE(fold->has_value()) << path;
  }
}

// A hand-made file: one foldable tensor of width 128, one token_embd, and
// the fold keys `keys` writes.
core::Expected<std::optional<HadamardFold>> read_made(const std::function<void(gguf::Writer&)>& keys) {
  gguf::Writer w;
  w.set_string("general.architecture", "qwen35");
  (void)w.add_tensor("token_embd.weight", core::GgmlType::F32, {128, 4}, std::vector<uint8_t>(128 * 4 * 4));
  (void)w.add_tensor("blk.0.ffn_up.weight", core::GgmlType::F32, {128, 8}, std::vector<uint8_t>(128 * 8 * 4));
  keys(w);
  const std::vector<uint8_t> bytes = w.to_bytes();
  auto f = gguf::File::parse(core::MappedFile::from_bytes(bytes, "made.gguf"));
  if (!f) return std::unexpected(f.error());
  return read_hadamard_fold(**f);
}

void identity_keys(gguf::Writer& w) {
  w.set_u32("prism.hadamard.version", 1);
  w.set_u32("prism.hadamard.block_size", 32);
  w.set_string("prism.hadamard.transform", "normalized-sylvester-walsh-hadamard");
  w.set_string("prism.hadamard.axis", "input-last-dimension");
  w.set_string("prism.hadamard.sign_mode", "identity");
  w.set_string_array("prism.hadamard.weight_names", {"blk.0.ffn_up.weight"});
}

TEST(HadamardFoldTest, IdentitySignModeNeedsNoSignKeys) {
  auto fold = read_made(identity_keys);
  ASSERT_TRUE(fold.has_value()) << fold.error().message;
  ASSERT_TRUE(fold->has_value());
  EXPECT_EQ((*fold)->sign_mode, HadamardFold::SignMode::kIdentity);
  EXPECT_TRUE((*fold)->signs_for(128).empty());
  EXPECT_FALSE((*fold)->gdn_v_grouped);
  EXPECT_TRUE((*fold)->inverse_names.empty());
  EXPECT_EQ(describe(**fold), "block 32, identity signs, 1 folded matrices, inverse []");
}

TEST(HadamardFoldTest, HandMadeRefusals) {
  struct Case {
    const char* what;
    std::function<void(gguf::Writer&)> edit;
    const char* key;
  };
  const Case cases[] = {
      {"unknown key", [](gguf::Writer& w) { w.set_u32("prism.hadamard.rotation_seed", 5); },
       "prism.hadamard.rotation_seed"},
      {"identity with signs", [](gguf::Writer& w) { w.set_i32_array("prism.hadamard.sign_widths", {128}); },
       "prism.hadamard.sign_widths"},
      {"version as a string", [](gguf::Writer& w) { w.set_string("prism.hadamard.version", "1"); },
       "prism.hadamard.version"},
      {"block 0", [](gguf::Writer& w) { w.set_u32("prism.hadamard.block_size", 0); }, "prism.hadamard.block_size"},
      {"width not a block multiple (identity)", [](gguf::Writer& w) { w.set_u32("prism.hadamard.block_size", 256); },
       "prism.hadamard.block_size"},
      {"token_embd folded",
       [](gguf::Writer& w) { w.set_string_array("prism.hadamard.weight_names", {"token_embd.weight"}); },
       "prism.hadamard.weight_names"},
      {"names not strings", [](gguf::Writer& w) { w.set_i32_array("prism.hadamard.weight_names", {1}); },
       "prism.hadamard.weight_names"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto fold = read_made([&](gguf::Writer& w) {
      identity_keys(w);
      c.edit(w);
    });
    ASSERT_FALSE(fold.has_value());
    EXPECT_NE(fold.error().message.find(c.key), std::string::npos) << fold.error().message;
  }
  // A missing required key is reported as missing.
  auto fold = read_made([](gguf::Writer& w) { w.set_u32("prism.hadamard.version", 1); });
  ASSERT_FALSE(fold.has_value());
  EXPECT_NE(fold.error().message.find("prism.hadamard.block_size"), std::string::npos) << fold.error().message;
}

}  // namespace
}  // namespace bonsai::model
