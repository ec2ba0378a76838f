// Split GGUFs (llama.cpp's gguf-split parts) read as one File: part names,
// write_split of the shared fixtures read back tensor for tensor and byte for
// byte (zero-copy: each tensor points into its own part's mapping), from any
// part's path; and every malformed set refused with an error that names the
// file and the key (missing part, split.count / split.no / split.tensors.count
// wrong, a tensor in two parts, a non-split file named like a part).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gguf/gguf.h"

namespace bonsai::gguf {
namespace {

namespace fs = std::filesystem;

// A fresh temp folder per test (unique per process), removed at the end.
class SplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("bonsai_gguf_split_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string at(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::shared_ptr<const File> open_ok(const std::string& path, const OpenOptions& opt = {}) {
  auto f = File::open(path, opt);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  return f ? *f : nullptr;
}

core::Error open_error(const std::string& path) {
  auto f = File::open(path);
  EXPECT_FALSE(f.has_value()) << path << " opened";
  return f ? core::Error{} : f.error();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(SplitName, ParsesGgufSplitNames) {
  auto s = parse_split_name("/m/Bonsai-8B-Q1_0-00002-of-00005.gguf");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->prefix, "/m/Bonsai-8B-Q1_0");
  EXPECT_EQ(s->no, 2);
  EXPECT_EQ(s->count, 5);
  EXPECT_EQ(split_part_name(s->prefix, 5, 5), "/m/Bonsai-8B-Q1_0-00005-of-00005.gguf");
  EXPECT_EQ(split_part_name("x", 12345, 99999), "x-12345-of-99999.gguf");
  EXPECT_TRUE(parse_split_name("-00001-of-00001.gguf").has_value());  // empty prefix
  for (const char* bad : {"m.gguf", "m-00001-of-00002.bin", "m-0001-of-00002.gguf", "m-00003-of-00002.gguf",
                          "m-00000-of-00002.gguf", "m-00001-of-00000.gguf", "m-0000a-of-00002.gguf",
                          "m-00001_of-00002.gguf", "m-+0001-of-00002.gguf", "m-00001-of-000002.gguf"}) {
    EXPECT_FALSE(parse_split_name(bad).has_value()) << bad;
  }
}

// Every tensor of `split` equals `whole`'s: name, order, type, shape, bytes;
// and lies in its own part's mapping at that part's data offset.
void expect_same_model(const File& whole, const File& split) {
  ASSERT_EQ(split.tensors().size(), whole.tensors().size());
  for (size_t i = 0; i < whole.tensors().size(); ++i) {
    const TensorInfo& a = whole.tensors()[i];
    const TensorInfo& b = split.tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.type_id, b.type_id) << a.name;
    EXPECT_EQ(a.ne, b.ne) << a.name;
    EXPECT_EQ(a.nb, b.nb) << a.name;
    ASSERT_EQ(a.n_bytes, b.n_bytes) << a.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
    ASSERT_LT(b.part, split.parts().size());
    const Part& p = split.parts()[b.part];
    EXPECT_EQ(b.data, p.mapping->data() + p.data_offset + b.offset) << a.name;
    EXPECT_LE(p.data_offset + b.offset + b.n_bytes, p.mapping->size()) << a.name;
    EXPECT_EQ(split.find_tensor(a.name), &b);
  }
  // Metadata: the whole file's keys and values, plus the three split.* keys.
  EXPECT_EQ(split.metadata().size(), whole.metadata().size() + 3);
  for (const KeyValue& kv : whole.metadata()) {
    const Value* v = split.find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_EQ(v->type, kv.value.type) << kv.key;
    if (kv.value.type == ValueType::kString) {
      EXPECT_EQ(*split.get<std::string>(kv.key), *whole.get<std::string>(kv.key));
    }
  }
  EXPECT_EQ(split.q2_layout(), whole.q2_layout());
}

TEST_F(SplitTest, StoriesSplitInThreeReadsAsTheWholeFromAnyPart) {
  const std::string src = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(src);
  auto whole = open_ok(src);
  ASSERT_TRUE(whole);
  auto paths = write_split(*whole, 3, at("stories"));
  ASSERT_TRUE(paths.has_value()) << paths.error().message;
  ASSERT_EQ(paths->size(), 3u);
  EXPECT_EQ((*paths)[0], at("stories-00001-of-00003.gguf"));
  EXPECT_EQ((*paths)[2], at("stories-00003-of-00003.gguf"));
  uint64_t on_disk = 0;
  for (const auto& p : *paths) on_disk += fs::file_size(p);
  for (const auto& p : *paths) {  // given any part, the set loads whole
    auto split = open_ok(p);
    ASSERT_TRUE(split) << p;
    EXPECT_TRUE(split->is_split());
    ASSERT_EQ(split->parts().size(), 3u);
    EXPECT_EQ(split->path(), (*paths)[0]);  // part 1 is the file the model is named by
    EXPECT_EQ(split->total_bytes(), on_disk);
    size_t n = 0;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(split->parts()[i].mapping->path(), (*paths)[i]);
      EXPECT_GT(split->parts()[i].n_tensors, 0u);
      n += split->parts()[i].n_tensors;
    }
    EXPECT_EQ(n, whole->tensors().size());
    EXPECT_EQ(*split->get<uint16_t>("split.count"), 3);
    EXPECT_EQ(*split->get<int32_t>("split.tensors.count"), static_cast<int32_t>(n));
    expect_same_model(*whole, *split);
  }
  // Each part alone (parse) is a valid GGUF holding its share.
  auto part2 = File::parse(*core::MappedFile::open((*paths)[1]));
  ASSERT_TRUE(part2.has_value()) << part2.error().message;
  EXPECT_EQ((*part2)->metadata().size(), 3u);  // split.* only, as gguf-split writes later parts
  EXPECT_EQ(*(*part2)->get<uint16_t>("split.no"), 1);
}

TEST_F(SplitTest, MetadataOnlyFirstPartAndQ2LayoutsPerPart) {
  // gguf-split --no-tensor-first-split; and a g128 Q2_0 file whose layout each
  // part detects on its own (the parts agree: the set has the whole's layout).
  for (const char* rel : {"fixtures/qwen3-tiny-q2_0-paired-g128-d-first.gguf",
                          "fixtures/qwen3-tiny-q2_0-paired-g128-qs-first.gguf", "fixtures/qwen3-tiny-q1_0.gguf"}) {
    const std::string src = test::shared_path(rel);
    BONSAI_REQUIRE_FILE(src);
    auto whole = open_ok(src);
    ASSERT_TRUE(whole);
    const std::string prefix = at(fs::path(rel).stem().string());
    auto paths = write_split(*whole, 4, prefix, /*no_tensors_in_first=*/true);
    ASSERT_TRUE(paths.has_value()) << paths.error().message;
    auto split = open_ok((*paths)[3]);
    ASSERT_TRUE(split) << rel;
    EXPECT_EQ(split->parts()[0].n_tensors, 0u);
    EXPECT_EQ(split->parts().size(), 4u);
    expect_same_model(*whole, *split);
    if (std::string(rel).find("q2_0") != std::string::npos) {
      EXPECT_TRUE(split->q2_layout().has_value());
    }
  }
}

TEST_F(SplitTest, WriteSplitRefusesImpossiblePlans) {
  const std::string src = test::shared_path("models/stories260K/stories260K.gguf");
  BONSAI_REQUIRE_FILE(src);
  auto whole = open_ok(src);
  ASSERT_TRUE(whole);
  const int n = static_cast<int>(whole->tensors().size());
  for (auto [parts, meta_first] : {std::pair{0, false}, {n + 1, false}, {1, true}, {70000, false}}) {
    auto r = write_split(*whole, parts, at("x"), meta_first);
    ASSERT_FALSE(r.has_value()) << parts;
    EXPECT_EQ(r.error().code, core::Errc::kInvalidArgument);
  }
  EXPECT_TRUE(fs::is_empty(dir_));
  auto one = write_split(*whole, n, at("each"));  // one tensor per part
  ASSERT_TRUE(one.has_value()) << one.error().message;
  auto f = open_ok((*one)[0]);
  ASSERT_TRUE(f);
  expect_same_model(*whole, *f);
}

// ---- malformed sets (small hand-made parts) ----

struct PartSpec {
  std::optional<int64_t> no, count, tensors;  // split.* values (nullopt: key left out)
  std::vector<std::string> names;             // F32 [32] tensors
  bool string_count = false;                  // split.count written as a string
};

void write_part(const std::string& path, const PartSpec& s) {
  Writer w;
  if (s.no) w.set_u16("split.no", static_cast<uint16_t>(*s.no));
  if (s.string_count) {
    w.set_string("split.count", "2");
  } else if (s.count) {
    w.set_u16("split.count", static_cast<uint16_t>(*s.count));
  }
  if (s.tensors) w.set_i32("split.tensors.count", static_cast<int32_t>(*s.tensors));
  w.set_string("general.architecture", "llama");
  for (const auto& n : s.names) {
    std::vector<uint8_t> bytes(32 * 4, 0);
    ASSERT_TRUE(w.add_tensor(n, core::GgmlType::F32, {32}, bytes).has_value());
  }
  ASSERT_TRUE(w.write(path).has_value());
}

TEST_F(SplitTest, HandMadeTwoPartSetLoads) {
  write_part(at("m-00001-of-00002.gguf"), {0, 2, 3, {"a", "b"}});
  write_part(at("m-00002-of-00002.gguf"), {1, 2, 3, {"c"}});
  auto f = open_ok(at("m-00002-of-00002.gguf"));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->find_tensor("c")->part, 1u);
  EXPECT_EQ(f->find_tensor("a")->part, 0u);
  EXPECT_EQ(*f->get<std::string>("general.architecture"), "llama");
  // A whole file named like the only part of a set, and a one-part set under any name, load alone.
  write_part(at("w-00001-of-00001.gguf"), {std::nullopt, std::nullopt, std::nullopt, {"a"}});
  EXPECT_FALSE(open_ok(at("w-00001-of-00001.gguf"))->is_split());
  write_part(at("one.gguf"), {0, 1, 1, {"a"}});
  EXPECT_EQ(open_ok(at("one.gguf"))->tensors().size(), 1u);
}

TEST_F(SplitTest, MissingPartIsNamed) {
  write_part(at("m-00001-of-00003.gguf"), {0, 3, 3, {"a"}});
  write_part(at("m-00003-of-00003.gguf"), {2, 3, 3, {"c"}});
  for (const char* given : {"m-00001-of-00003.gguf", "m-00003-of-00003.gguf"}) {
    const core::Error e = open_error(at(given));
    EXPECT_EQ(e.code, core::Errc::kNotFound);
    EXPECT_TRUE(contains(e.message, at("m-00002-of-00003.gguf") + ": missing: part 2 of 3")) << e.message;
  }
}

TEST_F(SplitTest, SplitCountMustAgree) {
  write_part(at("m-00001-of-00002.gguf"), {0, 2, 2, {"a"}});
  write_part(at("m-00002-of-00002.gguf"), {1, 3, 2, {"b"}});
  core::Error e = open_error(at("m-00001-of-00002.gguf"));
  EXPECT_EQ(e.code, core::Errc::kFormat);
  EXPECT_EQ(e.message, at("m-00002-of-00002.gguf") + ": key 'split.count' is 3, but its name says the set has 2 parts");
  // The given file's own split.count against its name.
  e = open_error(at("m-00002-of-00002.gguf"));
  EXPECT_EQ(e.message,
            at("m-00002-of-00002.gguf") + ": key 'split.count' is 3, but the file name says -of-00002.gguf (2 parts)");
  // Not an integer.
  write_part(at("s-00001-of-00002.gguf"), {0, std::nullopt, 2, {"a"}, /*string_count=*/true});
  write_part(at("s-00002-of-00002.gguf"), {1, 2, 2, {"b"}});
  e = open_error(at("s-00002-of-00002.gguf"));
  EXPECT_EQ(e.message, at("s-00001-of-00002.gguf") + ": key 'split.count' has type string, expected u16");
}

TEST_F(SplitTest, SplitNoMustMatchTheName) {
  write_part(at("m-00001-of-00002.gguf"), {0, 2, 2, {"a"}});
  write_part(at("m-00002-of-00002.gguf"), {0, 2, 2, {"b"}});  // says it is part 1
  const core::Error e = open_error(at("m-00001-of-00002.gguf"));
  EXPECT_EQ(e.code, core::Errc::kFormat);
  EXPECT_EQ(e.message, at("m-00002-of-00002.gguf") +
                           ": key 'split.no' is 0, but its name makes it part 2 of 2 (split.no 1: it counts from 0)");
  // A part without split.no.
  write_part(at("n-00001-of-00002.gguf"), {std::nullopt, 2, 2, {"a"}});
  write_part(at("n-00002-of-00002.gguf"), {1, 2, 2, {"b"}});
  EXPECT_TRUE(contains(open_error(at("n-00002-of-00002.gguf")).message,
                       at("n-00001-of-00002.gguf") + ": key 'split.no' is missing"));
}

TEST_F(SplitTest, DuplicateTensorAcrossPartsIsRefused) {
  write_part(at("m-00001-of-00002.gguf"), {0, 2, 3, {"a", "b"}});
  write_part(at("m-00002-of-00002.gguf"), {1, 2, 3, {"b"}});
  const core::Error e = open_error(at("m-00001-of-00002.gguf"));
  EXPECT_EQ(e.code, core::Errc::kFormat);
  EXPECT_EQ(e.message, at("m-00002-of-00002.gguf") + ": tensor 'b' is also in " + at("m-00001-of-00002.gguf") +
                           " (a tensor belongs to one part of a split GGUF)");
}

TEST_F(SplitTest, TensorCountMustMatch) {
  write_part(at("m-00001-of-00002.gguf"), {0, 2, 4, {"a", "b"}});
  write_part(at("m-00002-of-00002.gguf"), {1, 2, std::nullopt, {"c"}});
  core::Error e = open_error(at("m-00002-of-00002.gguf"));
  EXPECT_EQ(e.code, core::Errc::kFormat);
  EXPECT_EQ(e.message,
            at("m-00001-of-00002.gguf") + ": key 'split.tensors.count' is 4, but the 2 parts hold 3 tensors");
  // Later parts that carry it must agree with part 1.
  write_part(at("m-00002-of-00002.gguf"), {1, 2, 3, {"c"}});
  e = open_error(at("m-00002-of-00002.gguf"));
  EXPECT_TRUE(contains(e.message, at("m-00002-of-00002.gguf") + ": key 'split.tensors.count' is 3, but part 1 ("))
      << e.message;
  // Part 1 must carry it.
  write_part(at("m-00001-of-00002.gguf"), {0, 2, std::nullopt, {"a", "b"}});
  EXPECT_TRUE(contains(open_error(at("m-00002-of-00002.gguf")).message,
                       at("m-00001-of-00002.gguf") + ": key 'split.tensors.count' is missing"));
}

TEST_F(SplitTest, NonSplitFilesNamedLikePartsAreRefused) {
  // A whole model named like part 1 of 2, its sibling present or not.
  write_part(at("m-00001-of-00002.gguf"), {std::nullopt, std::nullopt, std::nullopt, {"a"}});
  core::Error e = open_error(at("m-00001-of-00002.gguf"));
  EXPECT_EQ(e.code, core::Errc::kFormat);
  EXPECT_EQ(e.message, at("m-00001-of-00002.gguf") +
                           ": the name says part 1 of 2 of a split GGUF, but the file has no 'split.count' key: it "
                           "is not a gguf-split part (a whole model renamed? rename it back to load it alone)");
  // A real part 1 whose sibling is not a part.
  write_part(at("p-00001-of-00002.gguf"), {0, 2, 2, {"a"}});
  write_part(at("p-00002-of-00002.gguf"), {std::nullopt, std::nullopt, std::nullopt, {"b"}});
  e = open_error(at("p-00001-of-00002.gguf"));
  EXPECT_TRUE(contains(e.message, at("p-00002-of-00002.gguf") + ": key 'split.count' is missing")) << e.message;
  // A part renamed so its siblings cannot be found.
  write_part(at("renamed.gguf"), {0, 2, 2, {"a"}});
  e = open_error(at("renamed.gguf"));
  EXPECT_TRUE(contains(e.message, at("renamed.gguf") + ": key 'split.count' is 2, but the file name does not end in "
                                                       "-NNNNN-of-00002.gguf"))
      << e.message;
  // Not a GGUF at all (e.g. a byte-cut half): the parser's error, naming that part.
  write_part(at("c-00001-of-00002.gguf"), {0, 2, 2, {"a"}});
  {
    FILE* f = std::fopen(at("c-00002-of-00002.gguf").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("tail bytes of a file cut in two", f);
    std::fclose(f);
  }
  e = open_error(at("c-00001-of-00002.gguf"));
  EXPECT_TRUE(contains(e.message, at("c-00002-of-00002.gguf") + ": offset 0: bad magic")) << e.message;
}

TEST(SplitParse, ParseSplitChecksTheSetWithoutNames) {
  auto bytes_of = [](const PartSpec& s) {
    Writer w;
    if (s.no) w.set_u16("split.no", static_cast<uint16_t>(*s.no));
    if (s.count) w.set_u16("split.count", static_cast<uint16_t>(*s.count));
    if (s.tensors) w.set_i32("split.tensors.count", static_cast<int32_t>(*s.tensors));
    for (const auto& n : s.names) EXPECT_TRUE(w.add_tensor(n, core::GgmlType::F32, {32}, std::vector<uint8_t>(128)));
    return w.to_bytes();
  };
  auto map = [](const std::vector<uint8_t>& b, const char* name) { return core::MappedFile::from_bytes(b, name); };
  const auto p1 = bytes_of({0, 2, 2, {"a"}}), p2 = bytes_of({1, 2, 2, {"b"}});
  auto ok = File::parse_split({map(p1, "one"), map(p2, "two")});
  ASSERT_TRUE(ok.has_value()) << ok.error().message;
  EXPECT_EQ((*ok)->tensors().size(), 2u);
  auto swapped = File::parse_split({map(p2, "two"), map(p1, "one")});
  ASSERT_FALSE(swapped.has_value());
  EXPECT_EQ(swapped.error().message,
            "two: key 'split.no' is 1, but it was given as part 1 of 2 (split.no 0: it counts from 0)");
  auto short_set = File::parse_split({map(p1, "one")});
  ASSERT_FALSE(short_set.has_value());
  EXPECT_EQ(short_set.error().message, "one: key 'split.count' is 2, but 1 part(s) were given");
  EXPECT_EQ(File::parse_split({}).error().code, core::Errc::kInvalidArgument);
  EXPECT_EQ(File::parse_split({nullptr}).error().code, core::Errc::kInvalidArgument);
  // release() of a range no part holds releases nothing.
  const uint8_t outside[4096] = {};
  EXPECT_EQ((*ok)->release(outside, sizeof outside), 0u);
}

}  // namespace
}  // namespace bonsai::gguf
