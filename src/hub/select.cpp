// Repository references and the choice of a model's files among a
// repository's (no network here): parse_repo_ref, select_model.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include "gguf/gguf.h"  // parse_split_name
#include "hub/hub.h"

namespace bonsai::hub {
namespace {

using core::Errc;
using core::fail;

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

bool ends_with_gguf(std::string_view path) { return path.size() > 5 && upper(path.substr(path.size() - 5)) == ".GGUF"; }

bool is_mmproj(std::string_view path) { return upper(path).find("MMPROJ") != std::string::npos; }

// Hub names: letters, digits, '-', '_', '.'; not empty, not "." or "..".
bool valid_name(std::string_view s) {
  if (s.empty() || s == "." || s == ".." || s.size() > 96) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// A model of the repository: one file, or a split set.
struct Candidate {
  std::string name;                  // the file, or "PREFIX-*-of-0000N.gguf" for a split set
  std::string key;                   // what tags are matched against: the path without the split suffix
  int count = 1;                     // parts expected
  std::map<int, std::string> parts;  // part number -> path
};

std::vector<Candidate> candidates(const std::vector<RepoFile>& files) {
  std::map<std::string, Candidate> by_key;
  for (const RepoFile& f : files) {
    if (!ends_with_gguf(f.path) || is_mmproj(f.path)) continue;
    if (auto s = gguf::parse_split_name(f.path)) {  // "PREFIX-00002-of-00005.gguf" (gguf-split)
      char suffix[32];
      std::snprintf(suffix, sizeof suffix, "-*-of-%05d.gguf", s->count);
      const std::string name = s->prefix + suffix;
      Candidate& c = by_key[name];
      c.name = name;
      c.key = s->prefix;
      c.count = s->count;
      c.parts[s->no] = f.path;
    } else {
      Candidate& c = by_key[f.path];
      c.name = f.path;
      c.key = f.path.substr(0, f.path.size() - 5);
      c.parts[1] = f.path;
    }
  }
  std::vector<Candidate> out;
  for (auto& [_, c] : by_key) out.push_back(std::move(c));
  return out;
}

// True when `tag` is one of the words of `key` split at '-', '.', '/'.
bool has_word(std::string_view key, std::string_view tag) {
  const std::string k = upper(key), t = upper(tag);
  size_t start = 0;
  for (size_t i = 0; i <= k.size(); ++i) {
    if (i == k.size() || k[i] == '-' || k[i] == '.' || k[i] == '/') {
      if (std::string_view(k).substr(start, i - start) == t) return true;
      start = i + 1;
    }
  }
  return false;
}

// The weight formats bonsai's kernels run (the Bonsai releases' own).
constexpr const char* kNativeTags[] = {"Q1_0", "Q2_0", "PQ2_0", "PTQ1_0"};

std::string listing(const std::vector<Candidate>& cs) {
  if (cs.empty()) return "no GGUF file";
  std::string s;
  for (const Candidate& c : cs) s += (s.empty() ? "" : ", ") + c.name;
  return s;
}

}  // namespace

std::string repo_folder_name(std::string_view repo) {
  std::string out = "models--";
  for (char c : repo) {
    if (c == '/')
      out += "--";
    else
      out += c;
  }
  return out;
}

core::Expected<RepoRef> parse_repo_ref(std::string_view arg, std::string_view file) {
  RepoRef ref;
  const std::string quoted = "-hf '" + std::string(arg) + "'";
  std::string_view repo = arg;
  if (const size_t colon = arg.find(':'); colon != std::string_view::npos) {
    repo = arg.substr(0, colon);
    const std::string_view tag = arg.substr(colon + 1);
    if (tag.empty()) return fail(Errc::kInvalidArgument, quoted + ": empty quant tag after ':' (e.g. :Q1_0)");
    if (ends_with_gguf(tag))
      ref.file = std::string(tag);
    else
      ref.tag = std::string(tag);
  }
  const size_t slash = repo.find('/');
  if (slash == std::string_view::npos || repo.find('/', slash + 1) != std::string_view::npos ||
      !valid_name(repo.substr(0, slash)) || !valid_name(repo.substr(slash + 1)))
    return fail(Errc::kInvalidArgument,
                quoted + ": expected a Hugging Face repository OWNER/NAME[:QUANT] (e.g. prism-ml/Bonsai-8B-gguf:Q1_0)");
  ref.repo = std::string(repo);
  if (!file.empty()) {
    if (!ref.file.empty() || !ref.tag.empty())
      return fail(Errc::kInvalidArgument, quoted + ": give either a ':' tag or -hff FILE, not both");
    if (file.starts_with('/') || file.find("..") != std::string_view::npos)
      return fail(Errc::kInvalidArgument, "-hff '" + std::string(file) + "': expected a path inside the repository");
    ref.file = std::string(file);
  }
  return ref;
}

core::Expected<Selection> select_model(const RepoRef& ref, const std::vector<RepoFile>& files) {
  const std::vector<Candidate> all = candidates(files);
  const std::string where = ref.repo + " has: " + listing(all);
  std::vector<const Candidate*> match;
  if (!ref.file.empty()) {
    bool exact_file = false;
    for (const RepoFile& f : files) exact_file |= f.path == ref.file;
    if (!exact_file) return fail(Errc::kNotFound, ref.repo + ": no file '" + ref.file + "' (" + where + ")");
    for (const Candidate& c : all)
      for (const auto& [_, p] : c.parts)
        if (p == ref.file) match.push_back(&c);
    if (match.empty())  // a file that is not a model (an mmproj, a README): taken as it is
      return Selection{.parts = {ref.file}};
  } else {
    for (const Candidate& c : all)
      if (ref.tag.empty() || has_word(c.key, ref.tag)) match.push_back(&c);
    if (match.empty()) {
      if (ref.tag.empty()) return fail(Errc::kNotFound, ref.repo + ": the repository has no GGUF model file");
      return fail(Errc::kNotFound, ref.repo + ": no model with quant tag '" + ref.tag + "' (" + where + ")");
    }
    if (match.size() > 1 && ref.tag.empty()) {
      // No tag: the one model in a format bonsai runs natively (a repository
      // with Ternary-Bonsai-8B-Q2_0.gguf and its -F16.gguf source: the Q2_0).
      std::vector<const Candidate*> native;
      for (const Candidate* c : match)
        if (std::any_of(std::begin(kNativeTags), std::end(kNativeTags),
                        [&](const char* t) { return has_word(c->key, t); }))
          native.push_back(c);
      if (native.size() == 1) match = native;
    }
    if (match.size() > 1) {
      std::vector<Candidate> listed;
      for (const Candidate* c : match) listed.push_back(*c);
      return fail(Errc::kInvalidArgument, ref.repo + ": " + std::to_string(match.size()) + " models match" +
                                              (ref.tag.empty() ? "" : " '" + ref.tag + "'") + " (" + listing(listed) +
                                              "); name one with :QUANT or -hff FILE");
    }
  }
  const Candidate& c = *match.front();
  if (static_cast<int>(c.parts.size()) != c.count) {
    std::string missing;
    for (int i = 1; i <= c.count; ++i)
      if (!c.parts.contains(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
    return fail(Errc::kFormat,
                ref.repo + ": split model " + c.name + " lacks part(s) " + missing + " of " + std::to_string(c.count));
  }
  Selection s;
  for (const auto& [_, p] : c.parts) s.parts.push_back(p);
  for (const RepoFile& f : files)
    if (ends_with_gguf(f.path) && is_mmproj(f.path)) {
      s.mmproj = f.path;
      break;
    }
  return s;
}

}  // namespace bonsai::hub
