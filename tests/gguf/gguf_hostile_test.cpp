// Writer round trip, and a generated hostile corpus: every truncation of a
// small valid file, deterministic bit flips, and hand-made files that break
// each validation rule. Each must be refused with kFormat/kUnsupported (and a
// "<name>: offset <N>: <rule>" message) or, for flips that keep the file
// valid, parse into tensors that lie inside the buffer. Run under
// -DBONSAI_SANITIZE=ON to prove there is no over-read.
#include <gtest/gtest.h>
#include <unistd.h>  // getpid: temp files unique per test process

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace bonsai::gguf {
namespace {

// Little-endian byte builder for hand-made files.
struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  Bytes& put(T v) {
    uint8_t x[sizeof(T)];
    std::memcpy(x, &v, sizeof(T));
    b.insert(b.end(), x, x + sizeof(T));
    return *this;
  }
  Bytes& str(std::string_view s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    put<uint32_t>(0x46554747).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
    return *this;
  }
  Bytes& kv_u32(std::string_view key, uint32_t v) { return str(key).put<uint32_t>(4).put<uint32_t>(v); }
  Bytes& tensor(std::string_view name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (int64_t d : ne) put<int64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Bytes& pad(size_t align = 32) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

core::Expected<std::shared_ptr<const File>> parse_bytes(const std::vector<uint8_t>& bytes,
                                                        const OpenOptions& opt = {}) {
  return File::parse(core::MappedFile::from_bytes(bytes, "mem.gguf"), opt);
}

// Asserts refusal with a format/unsupported error that names the file and an offset.
void expect_refused(const std::vector<uint8_t>& bytes, const std::string& rule_substr, const OpenOptions& opt = {}) {
  auto f = parse_bytes(bytes, opt);
  ASSERT_FALSE(f.has_value()) << "accepted a file that breaks: " << rule_substr;
  const auto code = f.error().code;
  EXPECT_TRUE(code == core::Errc::kFormat || code == core::Errc::kUnsupported) << f.error().message;
  EXPECT_EQ(f.error().message.rfind("mem.gguf: offset ", 0), 0u) << f.error().message;
  EXPECT_NE(f.error().message.find(rule_substr), std::string::npos)
      << "expected '" << rule_substr << "' in: " << f.error().message;
}

std::vector<uint8_t> iota_bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

// A small valid file: every scalar type, string arrays, three tensors whose
// last one ends exactly at EOF (so every strict prefix is invalid).
Writer small_writer() {
  Writer w;
  w.set_string("general.architecture", "qwen3");
  w.set_u8("t.u8", 200);
  w.set_i8("t.i8", -100);
  w.set_u16("t.u16", 60000);
  w.set_i16("t.i16", -30000);
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", -2000000000);
  w.set_u64("t.u64", 1ull << 60);
  w.set_i64("t.i64", -(1ll << 60));
  w.set_f32("t.f32", 0.15625f);
  w.set_f64("t.f64", 1e300);
  w.set_bool("t.bool", true);
  w.set_string_array("t.strs", {"a", "", "<|im_end|>", "\xc4\xa0the"});
  w.set_f32_array("t.f32s", {1.5f, -2.0f});
  w.set_i32_array("t.i32s", {-1, 0, 7});
  std::vector<uint8_t> f32(64 * 4);
  for (int i = 0; i < 64; ++i) {
    const float x = static_cast<float>(i) * 0.5f;
    std::memcpy(&f32[i * 4], &x, 4);
  }
  EXPECT_TRUE(w.add_tensor("a.weight", core::GgmlType::F32, {64}, f32));
  EXPECT_TRUE(w.add_tensor("b.weight", core::GgmlType::Q8_0, {64, 3}, iota_bytes(6 * 34, 1)));
  EXPECT_TRUE(w.add_tensor("c.weight", core::GgmlType::F16, {32, 4}, iota_bytes(256, 3)));
  return w;
}

TEST(GgufWriter, RoundTripsEveryValueType) {
  const auto bytes = small_writer().to_bytes();
  auto f = parse_bytes(bytes);
  ASSERT_TRUE(f) << f.error().message;
  const File& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get<std::string>("general.architecture").value(), "qwen3");
  EXPECT_EQ(g.get<uint8_t>("t.u8").value(), 200);
  EXPECT_EQ(g.get<int8_t>("t.i8").value(), -100);
  EXPECT_EQ(g.get<uint16_t>("t.u16").value(), 60000);
  EXPECT_EQ(g.get<int16_t>("t.i16").value(), -30000);
  EXPECT_EQ(g.get<uint32_t>("t.u32").value(), 4000000000u);
  EXPECT_EQ(g.get<int32_t>("t.i32").value(), -2000000000);
  EXPECT_EQ(g.get<uint64_t>("t.u64").value(), 1ull << 60);
  EXPECT_EQ(g.get<int64_t>("t.i64").value(), -(1ll << 60));
  EXPECT_EQ(g.get<float>("t.f32").value(), 0.15625f);
  EXPECT_EQ(g.get<double>("t.f64").value(), 1e300);
  EXPECT_TRUE(g.get<bool>("t.bool").value());
  EXPECT_EQ(g.find("t.u16")->type, ValueType::kUint16);
  EXPECT_EQ(g.find("t.i64")->type, ValueType::kInt64);
  EXPECT_FALSE(g.get<uint32_t>("t.i8").has_value());  // negative does not fit
  auto strs = g.get_string_array("t.strs");
  ASSERT_TRUE(strs);
  ASSERT_EQ(strs->size(), 4u);
  EXPECT_EQ((*strs)[2], "<|im_end|>");
  EXPECT_EQ((*strs)[1], "");
  EXPECT_EQ(g.get_f32_array("t.f32s").value(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(g.get_i32_array("t.i32s").value(), (std::vector<int32_t>{-1, 0, 7}));
  ASSERT_EQ(g.tensors().size(), 3u);
  const TensorInfo* b = g.find_tensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, core::GgmlType::Q8_0);
  EXPECT_EQ(b->ne[1], 3);
  EXPECT_EQ(b->nb[1], 68u);
  EXPECT_EQ(b->n_bytes, 204u);
  EXPECT_EQ(b->offset, 256u);
  EXPECT_EQ(std::vector<uint8_t>(b->data, b->data + b->n_bytes), iota_bytes(204, 1));
  const TensorInfo* a = g.find_tensor("a.weight");
  float x;
  std::memcpy(&x, a->data + 4 * 10, 4);
  EXPECT_EQ(x, 5.0f);
  EXPECT_EQ(g.data_offset() + g.tensors().back().offset + g.tensors().back().n_bytes, bytes.size());
}

TEST(GgufWriter, WriteStreamsSameBytesAsToBytes) {
  Writer w = small_writer();
  ASSERT_TRUE(w.add_tensor_generated("d.weight", core::GgmlType::F32, {8, 2}, [](std::span<uint8_t> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i ^ 0x5a);
  }));
  EXPECT_FALSE(w.add_tensor("a.weight", core::GgmlType::F32, {64}, std::vector<uint8_t>(256)));  // duplicate
  EXPECT_FALSE(w.add_tensor("e.weight", core::GgmlType::Q8_0, {33},
                            std::vector<uint8_t>(34)));                                        // not a block multiple
  EXPECT_FALSE(w.add_tensor("e.weight", core::GgmlType::F32, {4}, std::vector<uint8_t>(15)));  // wrong size
  const auto path =
      (std::filesystem::temp_directory_path() / ("bonsai_gguf_writer_test-" + std::to_string(::getpid()) + ".gguf"))
          .string();
  ASSERT_TRUE(w.write(path));
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(disk, w.to_bytes());
  auto f = File::open(path);
  ASSERT_TRUE(f) << f.error().message;
  const TensorInfo* d = (*f)->find_tensor("d.weight");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->n_bytes, 64u);
  EXPECT_EQ(d->data[3], 3 ^ 0x5a);
  std::filesystem::remove(path);
  EXPECT_FALSE(w.write("/nonexistent-dir/x.gguf"));
}

TEST(GgufWriter, CustomAlignment) {
  Writer w(64);
  ASSERT_TRUE(w.add_tensor("a", core::GgmlType::F32, {3}, std::vector<uint8_t>(12)));
  ASSERT_TRUE(w.add_tensor("b", core::GgmlType::F32, {16}, std::vector<uint8_t>(64)));
  auto f = parse_bytes(w.to_bytes());
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  EXPECT_EQ((*f)->find_tensor("b")->offset, 64u);
}

TEST(GgufReader, NestedArraysAndVersion2) {
  Bytes b;
  b.header(0, 2, /*version=*/2);
  // array of 2 arrays of i32: [[1,2,3],[]]
  b.str("nested").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(2);
  b.put<uint32_t>(5).put<uint64_t>(3).put<int32_t>(1).put<int32_t>(2).put<int32_t>(3);
  b.put<uint32_t>(5).put<uint64_t>(0);
  // array of arrays of strings: [["x","yz"]]
  b.str("nested.s").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1);
  b.put<uint32_t>(8).put<uint64_t>(2).str("x").str("yz");
  auto f = parse_bytes(b.b);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f)->version(), 2u);
  const Value* v = (*f)->find("nested");
  ASSERT_NE(v, nullptr);
  const Array& outer = std::get<Array>(v->v);
  EXPECT_EQ(outer.elem_type, ValueType::kArray);
  ASSERT_EQ(outer.items.size(), 2u);
  const Array& inner = std::get<Array>(outer.items[0].v);
  ASSERT_EQ(inner.items.size(), 3u);
  EXPECT_EQ(std::get<int64_t>(inner.items[2].v), 3);
  EXPECT_TRUE(std::get<Array>(outer.items[1].v).items.empty());
  const Array& s = std::get<Array>(std::get<Array>((*f)->find("nested.s")->v).items[0].v);
  EXPECT_EQ(std::get<std::string_view>(s.items[1].v), "yz");
  EXPECT_FALSE((*f)->get_i32_array("nested"));  // elements are arrays, not i32
}

TEST(GgufHostile, EveryTruncationIsRefused) {
  const auto bytes = small_writer().to_bytes();
  ASSERT_TRUE(parse_bytes(bytes));
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    auto f = parse_bytes(prefix);
    ASSERT_FALSE(f.has_value()) << "prefix of " << n << " bytes accepted";
    ASSERT_EQ(f.error().code, core::Errc::kFormat) << n << ": " << f.error().message;
    ASSERT_EQ(f.error().message.rfind("mem.gguf: offset ", 0), 0u) << f.error().message;
  }
}

TEST(GgufHostile, BitFlipsNeverCrash) {
  const auto bytes = small_writer().to_bytes();
  // Flip within the header region (metadata + tensor infos) where every byte
  // matters, plus anywhere; splitmix64 keeps it deterministic.
  uint64_t state = 0x1234;
  auto next = [&] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  auto f0 = parse_bytes(bytes);
  const size_t header = (*f0)->data_offset();
  int refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> m = bytes;
    const int flips = 1 + static_cast<int>(next() % 3);
    for (int k = 0; k < flips; ++k) {
      const size_t limit = iter % 4 == 0 ? m.size() : header;
      const size_t pos = next() % limit;
      m[pos] ^= static_cast<uint8_t>(1u << (next() % 8));
    }
    auto f = parse_bytes(m);
    if (!f) {
      ++refused;
      const auto code = f.error().code;
      ASSERT_TRUE(code == core::Errc::kFormat || code == core::Errc::kUnsupported) << f.error().message;
      continue;
    }
    for (const TensorInfo& t : (*f)->tensors()) {
      ASSERT_LE((*f)->data_offset() + t.offset + t.n_bytes, m.size());
      ASSERT_GE(t.data, (*f)->mapping()->data());
    }
  }
  EXPECT_GT(refused, 500);  // most header flips break a rule
}

// A valid base for hand-made variants: one F32 tensor of 8 floats.
std::vector<uint8_t> one_tensor(std::vector<int64_t> ne, uint32_t type, uint64_t offset, size_t data_bytes,
                                std::string_view extra_kv_key = {}, uint32_t extra_kv_val = 0) {
  Bytes b;
  b.header(1, extra_kv_key.empty() ? 0 : 1);
  if (!extra_kv_key.empty()) b.kv_u32(extra_kv_key, extra_kv_val);
  b.tensor("t", std::move(ne), type, offset).pad().zeros(data_bytes);
  return b.b;
}

TEST(GgufHostile, HandMadeFilesAreRefused) {
  ASSERT_TRUE(parse_bytes(one_tensor({8}, 0, 0, 32)));  // the base is valid

  {  // bad magic
    auto v = one_tensor({8}, 0, 0, 32);
    v[0] = 'X';
    expect_refused(v, "bad magic");
  }
  {  // unsupported versions: v1, v4, big-endian v3
    for (uint32_t ver : {1u, 4u, 0x03000000u}) {
      Bytes b;
      b.header(0, 0, ver);
      auto f = parse_bytes(b.b);
      ASSERT_FALSE(f);
      EXPECT_EQ(f.error().code, core::Errc::kUnsupported);
      EXPECT_NE(f.error().message.find("unsupported GGUF version"), std::string::npos);
    }
  }
  {  // huge counts
    Bytes b;
    b.header(1ull << 62, 0).zeros(64);
    expect_refused(b.b, "tensor count");
    Bytes c;
    c.header(0, ~0ull).zeros(64);
    expect_refused(c.b, "kv count");
    Bytes d;
    d.header(1, 2).zeros(40);  // each fits alone, not together
    expect_refused(d.b, "cannot fit");
  }
  {  // huge string lengths: key, string value, tensor name
    Bytes b;
    b.header(0, 1).put<uint64_t>(~0ull).zeros(16);
    expect_refused(b.b, "string length");
    Bytes c;
    c.header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(1ull << 40).zeros(16);
    expect_refused(c.b, "string length");
    Bytes d;
    d.header(1, 0).put<uint64_t>(1000).zeros(40);
    expect_refused(d.b, "string length");
  }
  {  // huge arrays and array bombs
    Bytes b;
    b.header(0, 1).str("a").put<uint32_t>(9).put<uint32_t>(5).put<uint64_t>(1ull << 61).zeros(64);
    expect_refused(b.b, "cannot fit");
    Bytes c;  // array of 2^40 empty arrays
    c.header(0, 1).str("a").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1ull << 40).zeros(64);
    expect_refused(c.b, "cannot fit");
    Bytes big;  // more array elements than the reader will hold, yet each fits in the file
    big.header(0, 1).str("a").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>(kMaxMetadataElements + 1);
    big.zeros(kMaxMetadataElements + 1);
    expect_refused(big.b, "elements in total");
    Bytes d;  // nesting bomb: 100 levels of single-element arrays
    d.header(0, 1).str("a").put<uint32_t>(9);
    for (int i = 0; i < 100; ++i) d.put<uint32_t>(9).put<uint64_t>(1);
    d.put<uint32_t>(4).put<uint64_t>(0);
    expect_refused(d.b, "nested deeper");
    Bytes e;  // array of strings, each claiming a huge length
    e.header(0, 1).str("a").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).put<uint64_t>(1ull << 50).zeros(16);
    expect_refused(e.b, "string length");
  }
  {  // bad value types
    Bytes b;
    b.header(0, 1).str("k").put<uint32_t>(13).zeros(16);
    expect_refused(b.b, "unknown value type 13");
    Bytes c;
    c.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(0).zeros(8);
    expect_refused(c.b, "unknown array element type 77");
    Bytes d;
    d.header(0, 1).str("k").put<uint32_t>(7).put<uint8_t>(2).zeros(16);
    expect_refused(d.b, "bool value must be 0 or 1");
  }
  {  // duplicate keys and tensor names
    Bytes b;
    b.header(0, 2).kv_u32("k", 1).kv_u32("k", 2);
    expect_refused(b.b, "duplicate metadata key 'k'");
    Bytes c;
    c.header(2, 0).tensor("t", {8}, 0, 0).tensor("t", {8}, 0, 32).pad().zeros(64);
    expect_refused(c.b, "duplicate tensor name 't'");
  }
  // unknown / removed ggml type ids (4 = removed Q4_2, 1000 = never existed)
  expect_refused(one_tensor({8}, 4, 0, 32), "unknown ggml type id 4");
  expect_refused(one_tensor({8}, 1000, 0, 32), "unknown ggml type id 1000");
  // n_dims and dims
  expect_refused(one_tensor({8, 1, 1, 1, 1}, 0, 0, 32), "n_dims 5");
  expect_refused(one_tensor({}, 0, 0, 32), "n_dims 0");
  expect_refused(one_tensor({8, 0}, 0, 0, 32), "ne[1] = 0");
  expect_refused(one_tensor({-8}, 0, 0, 32), "ne[0] = -8");
  expect_refused(one_tensor({1ll << 32, 1ll << 32}, 0, 0, 32), "overflows");
  expect_refused(one_tensor({1ll << 62, 1}, 0, 0, 32),
                 "byte size overflows");  // elements fit, bytes don't
  expect_refused(one_tensor({33}, 8, 0, 64), "not a multiple of the Q8_0 block size 32");
  expect_refused(one_tensor({100}, 41, 0, 64), "not a multiple of the Q1_0 block size 128");
  // offsets
  expect_refused(one_tensor({8}, 0, 4, 64), "not a multiple of the alignment 32");
  expect_refused(one_tensor({8}, 0, 0, 16), "past the end of the file");
  expect_refused(one_tensor({8}, 0, 1ull << 62, 32), "past the end of the file");
  expect_refused(one_tensor({8}, 0, ~0ull - 31, 32), "past the end of the file");
  {  // overlapping tensors
    Bytes b;
    b.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(96);
    expect_refused(b.b, "overlaps");
  }
  {  // data section past EOF: header not padded
    Bytes b;
    b.header(1, 0).tensor("t", {8}, 0, 0);
    expect_refused(b.b, "past the end of the file");
  }
  // general.alignment
  expect_refused(one_tensor({8}, 0, 0, 64, "general.alignment", 48), "not a power of two");
  expect_refused(one_tensor({8}, 0, 0, 64, "general.alignment", 0), "not a power of two");
  {
    Bytes b;
    b.header(0, 1).str("general.alignment").put<uint32_t>(8).str("32");
    expect_refused(b.b, "general.alignment has type string");
  }
  {  // a valid file with alignment 64
    auto v = one_tensor({8}, 0, 64, 128, "general.alignment", 64);
    auto f = parse_bytes(v);
    ASSERT_TRUE(f) << f.error().message;
    EXPECT_EQ((*f)->alignment(), 64u);
  }
}

TEST(GgufHostile, AmbiguousQ2LayoutIsRefusedUnlessForced) {
  // [128, 1] of type 42: 2×18 = 36 or 1×34 bytes, both pad to 64: geometry cannot tell.
  auto amb = one_tensor({128, 1}, 42, 0, 64);
  expect_refused(amb, "--q2-layout");
  OpenOptions opt;
  opt.q2_layout = core::Q2Layout::kG64;
  auto f = parse_bytes(amb, opt);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(*(*f)->q2_layout(), core::Q2Layout::kG64);
  EXPECT_EQ((*f)->tensors()[0].n_bytes, 36u);

  // [128, 64]: g64 needs 2304 bytes, g128 2176 (= file): geometry says g128.
  // All-zero data is valid in both byte orders: refused as ambiguous.
  auto zeros = one_tensor({128, 64}, 42, 0, 2176);
  expect_refused(zeros, "byte order is ambiguous");
  // d = 1.0 first, codes 0: only {d, qs} is valid ({qs, d} would read 0x3c = codes 0,3,3,0).
  auto d_first = zeros;
  const size_t data_at = d_first.size() - 2176;
  for (size_t blk = 0; blk < 64; ++blk) {
    d_first[data_at + blk * 34] = 0x00;
    d_first[data_at + blk * 34 + 1] = 0x3c;
  }
  auto g = parse_bytes(d_first);
  ASSERT_TRUE(g) << g.error().message;
  EXPECT_EQ(*(*g)->q2_layout(), core::Q2Layout::kG128DFirst);
  EXPECT_EQ((*g)->tensors()[0].n_bytes, 2176u);
  // The same blocks rotated to {qs, d}.
  auto qs_first = zeros;
  for (size_t blk = 0; blk < 64; ++blk) {
    qs_first[data_at + blk * 34 + 32] = 0x00;
    qs_first[data_at + blk * 34 + 33] = 0x3c;
  }
  auto h = parse_bytes(qs_first);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(*(*h)->q2_layout(), core::Q2Layout::kG128QsFirst);
  // A file with no type-42 tensor reports no layout even when one is forced.
  auto plain = parse_bytes(one_tensor({8}, 0, 0, 32), opt);
  ASSERT_TRUE(plain);
  EXPECT_FALSE((*plain)->q2_layout().has_value());
}

}  // namespace
}  // namespace bonsai::gguf
