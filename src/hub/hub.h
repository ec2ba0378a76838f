// bonsai::hub: models from the Hugging Face Hub by repository name
// (`bonsai run -hf prism-ml/Bonsai-8B-gguf:Q1_0`), kept in the Hugging Face
// cache so that huggingface_hub and other tools share the files.
//
// The Hub's HTTP API (https://huggingface.co/docs/hub/api):
//   GET  {endpoint}/api/models/{repo}/tree/{revision}?recursive=true
//        -> [{"type":"file","path","size","lfs":{"oid":sha256,"size"}}...]
//   HEAD {endpoint}/{repo}/resolve/{revision}/{file}
//        -> 200, or 302 to a CDN for LFS files; headers X-Repo-Commit,
//           X-Linked-Etag (LFS: the sha256) or ETag, X-Linked-Size
//   GET  the same URL (or the redirect's) with `Range: bytes=N-` to resume.
// The cache (huggingface_hub's layout,
// https://huggingface.co/docs/huggingface_hub/guides/manage-cache):
//   $HF_HUB_CACHE (default $HF_HOME/hub, $HF_HOME default ~/.cache/huggingface)
//     models--{owner}--{name}/
//       blobs/{etag}               the file's bytes (etag: sha256 for LFS files)
//       blobs/{etag}.incomplete    a download in progress (never loaded)
//       snapshots/{commit}/{path}  relative symlink to ../../blobs/{etag}
//       refs/{revision}            the commit the revision pointed to
//     .locks/models--{owner}--{name}/{etag}.lock   one downloader per blob
// Environment (huggingface_hub's names): HF_HOME, HF_HUB_CACHE, HF_ENDPOINT
// (a mirror; default https://huggingface.co), HF_TOKEN (else the file
// $HF_HOME/token that `huggingface-cli login` writes; sent only to the
// endpoint's own host, never logged), HF_HUB_OFFLINE=1 (the cache only).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace bonsai::hub {

// Where and how to reach the Hub. options_from_env() fills it from the
// environment; tests and callers may set the fields directly.
struct HubOptions {
  std::string endpoint = "https://huggingface.co";  // no trailing '/'
  std::string token;                                // empty: anonymous
  std::filesystem::path cache_dir;                  // the hub cache ($HF_HUB_CACHE)
  bool offline = false;                             // HF_HUB_OFFLINE: never touch the network
  std::string revision = "main";                    // branch, tag or commit
  int max_retries = 5;                              // resumed attempts after a dropped connection, per file
  // false: a model the cache holds is used without asking the Hub (-hf);
  // true: the Hub is asked for the revision's current files first (pull).
  bool check_for_update = false;
};

// The options from the environment (see the file comment). Errors:
// kInvalidArgument "HF_HUB_OFFLINE='x' is not a switch (expected 1 or 0)".
core::Expected<HubOptions> options_from_env();

// What `-hf REPO[:FILE_OR_QUANT]` (and `-hff FILE`) ask for.
struct RepoRef {
  std::string repo;  // "owner/name"
  std::string tag;   // quant tag ("Q1_0", case-insensitive); empty: the repository's only model
  std::string file;  // an exact file path in the repository (-hff, or a tag ending in .gguf)
};

// Parses "owner/name[:TAG]" (llama.cpp's -hf syntax) plus -hff's `file`
// (may be empty). A TAG ending in ".gguf" is a file path. Errors:
// kInvalidArgument naming the argument: not "owner/name", an empty part,
// characters outside [A-Za-z0-9._-] in the names, both a file TAG and -hff.
core::Expected<RepoRef> parse_repo_ref(std::string_view arg, std::string_view file = {});

// One file of a repository, as the tree listing (or the cache) gives it.
struct RepoFile {
  std::string path;    // relative to the repository root ("Bonsai-8B-Q1_0.gguf")
  uint64_t size = 0;   // bytes (0 when unknown: cache listings)
  std::string sha256;  // lowercase hex of an LFS file; empty otherwise
};

// The files one model needs: a single GGUF, or every part of a split GGUF
// ("-00001-of-00003.gguf" ... "-00003-of-00003.gguf", in order).
struct Selection {
  std::vector<std::string> parts;
  std::optional<std::string> mmproj;  // a multimodal projector file in the repository, if any (not fetched)
};

// Picks the model `ref` names among `files` (the repository's paths):
//  - ref.file: that exact path (with its split siblings when it is part 1 of a split);
//  - ref.tag: the one model whose path has the tag as a whole '-' / '.' /
//    '/' separated word, case-insensitively (Q2_0 does not match PQ2_0);
//  - neither: the repository's only model, or else its only model in a
//    format bonsai runs natively (Q1_0, Q2_0, PQ2_0, PTQ1_0: a repository's
//    Q2_0 file beside its F16 source).
// Files whose name holds "mmproj" are never the model. Errors (each lists
// the repository's models, e.g. "has: Bonsai-8B-Q1_0.gguf, Bonsai-8B-Q2_0.gguf"):
// kNotFound (no such file or tag; no GGUF at all), kInvalidArgument
// (several models match: give a tag or -hff), kFormat (a split model with
// parts missing).
core::Expected<Selection> select_model(const RepoRef& ref, const std::vector<RepoFile>& files);

// Progress of one file's download: `done` / `total` bytes (total 0: unknown).
// Called from the downloading thread, at most every few hundred KiB.
using ProgressFn = std::function<void(std::string_view file, uint64_t done, uint64_t total)>;

// A model ready to load: the snapshot paths of its parts.
struct ModelFiles {
  std::string repo;
  std::string commit;
  std::vector<std::filesystem::path> parts;  // snapshots/{commit}/{path}, in order (one unless split)
  std::optional<std::string> mmproj;         // repository path of an mmproj file, noted and not fetched
  bool from_cache = false;                   // true: nothing was fetched (no network used)
};

// The model `ref` names, from the cache when refs/{revision} points at a
// snapshot that holds it (no network; unless options.check_for_update and
// not offline), else resolved through the Hub's API
// and downloaded (resuming a previous .incomplete, retrying a dropped
// connection up to options.max_retries times with `Range`), its sha256
// checked against the Hub's before it is moved into blobs/ and linked from
// the snapshot. Errors are one line naming the repository, the file and
// what to do: kNotFound (repository, revision or file 404; not in the cache
// while offline), kInvalidArgument (401/403: token missing or refused;
// ambiguous tag), kIo (no network, other HTTP errors, a write failure),
// kResourceExhausted (disk full, checked before the download and on each
// write), kFormat (checksum mismatch: the download is deleted).
core::Expected<ModelFiles> fetch_model(const RepoRef& ref, const HubOptions& options, const ProgressFn& progress = {});

// One model in the cache (`bonsai list`): a GGUF file, or a split model
// (gguf-split's "PREFIX-00001-of-0000N.gguf" ... parts) as one entry.
struct CachedFile {
  std::string repo;             // "owner/name"
  std::string commit;           // the snapshot
  std::string path;             // in the repository; a split model: its first part (what -hf / -m load)
  std::filesystem::path local;  // snapshots/{commit}/{path}
  uint64_t size = 0;            // bytes of the blob; a split model: of every part present
  int parts = 1;                // files of the model: 1, or a split model's part count N
  int parts_present = 1;        // of those, the ones in the snapshot (< parts: incomplete, cannot load)
  bool current = false;         // the snapshot is the one refs/main names
};

// Every *.gguf model in the cache's model snapshots whose blobs are
// complete, one entry per model (the parts of a split model are grouped
// under its first part), sorted by repository and path. A missing cache is
// an empty list.
std::vector<CachedFile> list_cached(const HubOptions& options);

// "models--owner--name" for "owner/name" (huggingface_hub's folder name).
std::string repo_folder_name(std::string_view repo);

}  // namespace bonsai::hub
