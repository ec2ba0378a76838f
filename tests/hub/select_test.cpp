// hub::parse_repo_ref and hub::select_model: which files of a repository a
// `-hf OWNER/NAME[:QUANT]` names (no network; the downloader is hub_test.sh).
#include <gtest/gtest.h>

#include "hub/hub.h"

namespace bonsai::hub {
namespace {

std::vector<RepoFile> files(std::initializer_list<const char*> paths) {
  std::vector<RepoFile> out;
  for (const char* p : paths) out.push_back({p, 1, {}});
  return out;
}

Selection pick(const std::string& arg, const std::vector<RepoFile>& fs, const std::string& file = {}) {
  auto ref = parse_repo_ref(arg, file);
  EXPECT_TRUE(ref.has_value()) << ref.error().message;
  auto s = select_model(*ref, fs);
  EXPECT_TRUE(s.has_value()) << s.error().message;
  return s.value_or(Selection{});
}

core::Error refusal(const std::string& arg, const std::vector<RepoFile>& fs) {
  auto ref = parse_repo_ref(arg);
  EXPECT_TRUE(ref.has_value());
  auto s = select_model(*ref, fs);
  EXPECT_FALSE(s.has_value());
  return s ? core::Error{} : s.error();
}

TEST(HubRef, ParsesRepoTagAndFile) {
  auto r = parse_repo_ref("prism-ml/Bonsai-8B-gguf:Q1_0");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->repo, "prism-ml/Bonsai-8B-gguf");
  EXPECT_EQ(r->tag, "Q1_0");
  EXPECT_EQ(r->file, "");
  r = parse_repo_ref("prism-ml/Bonsai-8B-gguf:sub/Bonsai-8B.gguf");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->file, "sub/Bonsai-8B.gguf");
  EXPECT_EQ(r->tag, "");
  r = parse_repo_ref("a/b", "x.gguf");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->file, "x.gguf");
}

TEST(HubRef, RefusesMalformedNames) {
  for (const char* bad : {"", "noslash", "a/b/c", "/b", "a/", "a b/c", "a/..", "a/b:", "../etc/passwd"}) {
    auto r = parse_repo_ref(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, core::Errc::kInvalidArgument);
    EXPECT_NE(r.error().message.find(std::string("-hf '") + bad + "'"), std::string::npos) << r.error().message;
  }
  EXPECT_FALSE(parse_repo_ref("a/b:Q1_0", "x.gguf").has_value());  // a tag and -hff
  EXPECT_FALSE(parse_repo_ref("a/b", "../x.gguf").has_value());
  EXPECT_FALSE(parse_repo_ref("a/b", "/abs.gguf").has_value());
}

const std::vector<RepoFile> kBonsai =
    files({"README.md", "Bonsai-27B-Q2_0.gguf", "Bonsai-27B-PQ2_0.gguf", "Bonsai-27B-PTQ1_0.gguf",
           "Bonsai-27B-Q1_0.gguf", "mmproj-Bonsai-27B-F16.gguf"});

TEST(HubSelect, TagIsAWholeWordCaseInsensitive) {
  EXPECT_EQ(pick("p/r:Q2_0", kBonsai).parts, std::vector<std::string>{"Bonsai-27B-Q2_0.gguf"});
  EXPECT_EQ(pick("p/r:pq2_0", kBonsai).parts, std::vector<std::string>{"Bonsai-27B-PQ2_0.gguf"});
  EXPECT_EQ(pick("p/r:Q1_0", kBonsai).parts, std::vector<std::string>{"Bonsai-27B-Q1_0.gguf"});
  EXPECT_EQ(pick("p/r:PTQ1_0", kBonsai).parts, std::vector<std::string>{"Bonsai-27B-PTQ1_0.gguf"});
  EXPECT_EQ(pick("p/r:PTQ1_0", kBonsai).mmproj, std::optional<std::string>("mmproj-Bonsai-27B-F16.gguf"));
  // Dots and folders separate words too.
  EXPECT_EQ(pick("p/r:Q1_0", files({"Q1_0/model.gguf", "Q2_0/model.gguf"})).parts,
            std::vector<std::string>{"Q1_0/model.gguf"});
  EXPECT_EQ(pick("p/r:Q1_0", files({"model.Q1_0.gguf", "model.Q2_0.gguf"})).parts,
            std::vector<std::string>{"model.Q1_0.gguf"});
}

TEST(HubSelect, MissingOrAmbiguousListsTheRepository) {
  auto e = refusal("p/r:Q4_K_M", kBonsai);
  EXPECT_EQ(e.code, core::Errc::kNotFound);
  EXPECT_EQ(e.message,
            "p/r: no model with quant tag 'Q4_K_M' (p/r has: Bonsai-27B-PQ2_0.gguf, Bonsai-27B-PTQ1_0.gguf, "
            "Bonsai-27B-Q1_0.gguf, Bonsai-27B-Q2_0.gguf)");
  e = refusal("p/r", kBonsai);
  EXPECT_EQ(e.code, core::Errc::kInvalidArgument);
  EXPECT_EQ(e.message,
            "p/r: 4 models match (Bonsai-27B-PQ2_0.gguf, Bonsai-27B-PTQ1_0.gguf, Bonsai-27B-Q1_0.gguf, "
            "Bonsai-27B-Q2_0.gguf); name one with :QUANT or -hff FILE");
  // Two files with the tag (two sizes in one repository).
  e = refusal("p/r:Q1_0", files({"A-1B-Q1_0.gguf", "A-8B-Q1_0.gguf"}));
  EXPECT_EQ(e.message,
            "p/r: 2 models match 'Q1_0' (A-1B-Q1_0.gguf, A-8B-Q1_0.gguf); name one with :QUANT or -hff FILE");
  e = refusal("p/r", files({"README.md", "mmproj-x.gguf"}));
  EXPECT_EQ(e.message, "p/r: the repository has no GGUF model file");
  // Without a tag, the one model in a native format beats an F16 source.
  EXPECT_EQ(pick("p/r", files({"T-8B-F16.gguf", "T-8B-Q2_0.gguf"})).parts, std::vector<std::string>{"T-8B-Q2_0.gguf"});
  // The only model is taken without a tag; an mmproj file is never the model.
  EXPECT_EQ(pick("p/r", files({"mmproj-x.gguf", "x-Q1_0.gguf"})).parts, std::vector<std::string>{"x-Q1_0.gguf"});
}

TEST(HubSelect, SplitModelsComeWhole) {
  const auto fs =
      files({"M-Q1_0-00002-of-00003.gguf", "M-Q1_0-00001-of-00003.gguf", "M-Q1_0-00003-of-00003.gguf", "M-Q2_0.gguf"});
  const std::vector<std::string> want = {"M-Q1_0-00001-of-00003.gguf", "M-Q1_0-00002-of-00003.gguf",
                                         "M-Q1_0-00003-of-00003.gguf"};
  EXPECT_EQ(pick("p/r:Q1_0", fs).parts, want);
  EXPECT_EQ(pick("p/r", fs, "M-Q1_0-00001-of-00003.gguf").parts, want);  // -hff of part 1: the set
  EXPECT_EQ(pick("p/r:Q2_0", fs).parts, std::vector<std::string>{"M-Q2_0.gguf"});
  auto e = refusal("p/r:Q1_0", files({"M-Q1_0-00001-of-00003.gguf", "M-Q1_0-00003-of-00003.gguf"}));
  EXPECT_EQ(e.code, core::Errc::kFormat);
  EXPECT_EQ(e.message, "p/r: split model M-Q1_0-*-of-00003.gguf lacks part(s) 2 of 3");
  e = refusal("p/r", fs);
  EXPECT_NE(e.message.find("M-Q1_0-*-of-00003.gguf, M-Q2_0.gguf"), std::string::npos) << e.message;
}

TEST(HubSelect, ExactFile) {
  EXPECT_EQ(pick("p/r:Bonsai-27B-Q2_0.gguf", kBonsai).parts, std::vector<std::string>{"Bonsai-27B-Q2_0.gguf"});
  auto ref = parse_repo_ref("p/r", "Nope.gguf");
  ASSERT_TRUE(ref.has_value());
  auto s = select_model(*ref, kBonsai);
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code, core::Errc::kNotFound);
  EXPECT_TRUE(s.error().message.starts_with("p/r: no file 'Nope.gguf' (p/r has: Bonsai-27B-PQ2_0.gguf"))
      << s.error().message;
}

TEST(HubCache, FolderName) {
  EXPECT_EQ(repo_folder_name("prism-ml/Bonsai-8B-gguf"), "models--prism-ml--Bonsai-8B-gguf");
}

}  // namespace
}  // namespace bonsai::hub
