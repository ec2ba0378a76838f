// Dequantization of real fixture tensors (read through bonsai::gguf::File):
// rows must equal ggml's dequantization in ../shared/fixtures/golden/
// dequant.json exactly, and the three qwen3-tiny-q2_0-paired-* files (the
// same weights in the three type-42 layouts) must dequantize to identical
// values, tensor by tensor. (tests/gguf checks the layout detection; this
// checks the values.)
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"

namespace bonsai::kernels {
namespace {

std::optional<Format> tensor_format(const gguf::File& file, const gguf::TensorInfo& t) {
  return format_of(t.type, file.q2_layout().value_or(core::Q2Layout::kG64));
}

std::vector<float> dequant_tensor_row(const gguf::File& file, const gguf::TensorInfo& t, int64_t row) {
  const auto f = tensor_format(file, t);
  std::vector<float> out(static_cast<size_t>(t.ne[0]));
  if (!f) return {};
  dequantize_row(*f, t.data + row * t.nb[1], out.data(), t.ne[0]);
  return out;
}

TEST(GoldenDequant, RowsMatchGgmlExactly) {
  const std::string golden = test::shared_path("fixtures/golden/dequant.json");
  BONSAI_REQUIRE_FILE(golden);
  std::ifstream in(golden);
  const auto j = nlohmann::json::parse(in);
  int checked_rows = 0;
  for (const auto& fj : j.at("files")) {
    const std::string path = test::shared_path("fixtures/" + fj.at("file").get<std::string>());
    BONSAI_REQUIRE_FILE(path);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.has_value()) << file.error().message;
    for (const auto& tj : fj.at("tensors")) {
      const std::string name = tj.at("name").get<std::string>();
      const gguf::TensorInfo* t = (*file)->find_tensor(name);
      ASSERT_NE(t, nullptr) << path << ": " << name;
      EXPECT_EQ(t->type_id, tj.at("type").get<uint32_t>()) << name;
      EXPECT_EQ(t->ne[0], tj.at("ne")[0].get<int64_t>()) << name;
      ASSERT_TRUE(tensor_format(**file, *t).has_value()) << name;
      for (const auto& [row_key, values] : tj.at("rows").items()) {
        const int64_t row = std::stoll(row_key);
        ASSERT_LT(row, t->ne[1]);
        const auto got = dequant_tensor_row(**file, *t, row);
        ASSERT_EQ(got.size(), values.size()) << name << " row " << row;
        int mismatches = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const float want = static_cast<float>(values[i].get<double>());
          if (got[i] != want && ++mismatches <= 5) {
            ADD_FAILURE() << fj.at("file") << " " << name << " row " << row << " [" << i << "]: got " << got[i]
                          << " want " << want;
          }
        }
        EXPECT_EQ(mismatches, 0) << name << " row " << row;
        ++checked_rows;
      }
    }
  }
  EXPECT_GE(checked_rows, 15);
}

TEST(GoldenDequant, PairedQ2LayoutsDequantizeIdentically) {
  const char* names[3] = {"fixtures/qwen3-tiny-q2_0-paired-g64.gguf",
                          "fixtures/qwen3-tiny-q2_0-paired-g128-d-first.gguf",
                          "fixtures/qwen3-tiny-q2_0-paired-g128-qs-first.gguf"};
  const Format expect_fmt[3] = {Format::kQ2_0, Format::kQ2_0G128D, Format::kQ2_0G128Qs};
  std::shared_ptr<const gguf::File> files[3];
  for (int i = 0; i < 3; ++i) {
    const std::string path = test::shared_path(names[i]);
    BONSAI_REQUIRE_FILE(path);
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.has_value()) << f.error().message;
    files[i] = *f;
  }
  ASSERT_EQ(files[0]->tensors().size(), files[1]->tensors().size());
  ASSERT_EQ(files[0]->tensors().size(), files[2]->tensors().size());
  int q2_tensors = 0;
  std::vector<float> a, b;
  for (const auto& t0 : files[0]->tensors()) {
    const gguf::TensorInfo* ts[3] = {&t0, files[1]->find_tensor(t0.name), files[2]->find_tensor(t0.name)};
    ASSERT_NE(ts[1], nullptr) << t0.name;
    ASSERT_NE(ts[2], nullptr) << t0.name;
    if (t0.type != core::GgmlType::Q2_0) continue;
    ++q2_tensors;
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(tensor_format(*files[i], *ts[i]), expect_fmt[i]) << names[i] << " " << t0.name;
      ASSERT_EQ(ts[i]->ne, t0.ne) << t0.name;
    }
    const int64_t cols = t0.ne[0];
    const int64_t rows = t0.n_elements() / cols;
    a.resize(static_cast<size_t>(cols));
    b.resize(static_cast<size_t>(cols));
    int64_t bad_rows = 0;
    int64_t nonzero = 0;
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(Format::kQ2_0, ts[0]->data + r * ts[0]->nb[1], a.data(), cols);
      for (float v : a) nonzero += v != 0.0f;
      for (int i = 1; i < 3; ++i) {
        dequantize_row(expect_fmt[i], ts[i]->data + r * ts[i]->nb[1], b.data(), cols);
        if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0 && ++bad_rows <= 3) {
          ADD_FAILURE() << t0.name << " row " << r << " differs in " << names[i];
        }
      }
    }
    EXPECT_EQ(bad_rows, 0) << t0.name;
    EXPECT_GT(nonzero, t0.n_elements() / 2) << t0.name;  // real ternary data, not all zero
  }
  EXPECT_GE(q2_tensors, 15);
}

}  // namespace
}  // namespace bonsai::kernels
