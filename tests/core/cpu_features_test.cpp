#include "core/cpu_features.h"

#include <gtest/gtest.h>

#include "core/ggml_types.h"

namespace bonsai::core {
namespace {

TEST(CpuFeatures, ConsistentImplications) {
  const CpuFeatures& f = cpu_features();
  EXPECT_GE(f.physical_cores, 1);
  if (f.avx512bw || f.avx512vl || f.avx512vnni) {
    EXPECT_TRUE(f.avx512f);
  }
#if defined(__x86_64__)
  EXPECT_FALSE(f.neon);
#endif
}

TEST(GgmlTypes, TraitsMatchGgml) {
  auto q1 = ggml_type_traits(41);
  ASSERT_TRUE(q1.has_value());
  EXPECT_EQ(q1->name, "Q1_0");
  EXPECT_EQ(q1->block_size, 128u);
  EXPECT_EQ(q1->type_size, 18u);
  auto q8 = ggml_type_traits(8);
  ASSERT_TRUE(q8.has_value());
  EXPECT_EQ(q8->type_size, 34u);
  EXPECT_FALSE(ggml_type_traits(4).has_value());  // removed Q4_2
  EXPECT_FALSE(ggml_type_traits(9999).has_value());
  EXPECT_EQ(ggml_type_name(9999), "UNKNOWN(9999)");
  EXPECT_EQ(q2_block_geometry(Q2Layout::kG128QsFirst).type_size, 34u);
  EXPECT_EQ(parse_q2_layout("g128-d-first"), Q2Layout::kG128DFirst);
  EXPECT_FALSE(parse_q2_layout("g32").has_value());
}

}  // namespace
}  // namespace bonsai::core
