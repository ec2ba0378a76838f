#include "core/ggml_types.h"

#include <array>
#include <string>

namespace bonsai::core {
namespace {

struct Entry {
  uint32_t id;
  GgmlTypeTraits traits;
};

// Source: ggml/src/ggml.c type_traits[] (llama.cpp), plus Q1_0 / Q2_0 as
// PrismML's fork and llama.cpp define them, and PQ2_0 / PTQ1_0 as the
// fixtures README describes PrismML's fork (its ff6b68f3 has PQ2_0).
constexpr std::array<Entry, 36> kTypes = {{
    {0, {"F32", 1, 4}},         {1, {"F16", 1, 2}},         {2, {"Q4_0", 32, 18}},      {3, {"Q4_1", 32, 20}},
    {6, {"Q5_0", 32, 22}},      {7, {"Q5_1", 32, 24}},      {8, {"Q8_0", 32, 34}},      {9, {"Q8_1", 32, 36}},
    {10, {"Q2_K", 256, 84}},    {11, {"Q3_K", 256, 110}},   {12, {"Q4_K", 256, 144}},   {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}},   {15, {"Q8_K", 256, 292}},   {16, {"IQ2_XXS", 256, 66}}, {17, {"IQ2_XS", 256, 74}},
    {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},   {20, {"IQ4_NL", 32, 18}},   {21, {"IQ3_S", 256, 110}},
    {22, {"IQ2_S", 256, 82}},   {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},         {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},        {27, {"I64", 1, 8}},        {28, {"F64", 1, 8}},        {29, {"IQ1_M", 256, 56}},
    {30, {"BF16", 1, 2}},       {34, {"TQ1_0", 256, 54}},   {35, {"TQ2_0", 256, 66}},   {39, {"MXFP4", 32, 17}},
    {41, {"Q1_0", 128, 18}},    {42, {"Q2_0", 64, 18}},     {142, {"PQ2_0", 128, 34}},  {143, {"PTQ1_0", 128, 28}},
}};

}  // namespace

std::string_view q2_layout_name(Q2Layout layout) {
  switch (layout) {
    case Q2Layout::kG64:
      return "g64";
    case Q2Layout::kG128DFirst:
      return "g128-d-first";
    case Q2Layout::kG128QsFirst:
      return "g128-qs-first";
  }
  return "g64";
}

std::optional<Q2Layout> parse_q2_layout(std::string_view name) {
  if (name == "g64") return Q2Layout::kG64;
  if (name == "g128-d-first") return Q2Layout::kG128DFirst;
  if (name == "g128-qs-first") return Q2Layout::kG128QsFirst;
  return std::nullopt;
}

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id) {
  for (const Entry& e : kTypes) {
    if (e.id == type_id) return e.traits;
  }
  return std::nullopt;
}

GgmlTypeTraits q2_block_geometry(Q2Layout layout) {
  if (layout == Q2Layout::kG64) return {"Q2_0", 64, 18};
  return {"Q2_0", 128, 34};
}

std::string ggml_type_name(uint32_t type_id) {
  if (auto t = ggml_type_traits(type_id)) return std::string(t->name);
  return "UNKNOWN(" + std::to_string(type_id) + ")";
}

}  // namespace bonsai::core
