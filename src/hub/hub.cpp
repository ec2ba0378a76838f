// The Hub client: HTTP with libcurl (redirects followed here, so that the
// token goes to the endpoint's host only), the cache layout, resumable
// downloads checked with OpenSSL's SHA-256. See hub.h.
#include "hub/hub.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "gguf/gguf.h"  // parse_split_name, split_part_name: split models in list_cached

namespace bonsai::hub {
namespace {

namespace fs = std::filesystem;
using core::Errc;
using core::fail;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

bool is_hex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit((unsigned char)c); });
}

// ---- HTTP -------------------------------------------------------------------------------

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// scheme://host:port of a URL, lowercase (the unit the token is scoped to);
// empty when the URL does not parse.
std::string origin_of(const std::string& url) {
  CURLU* u = curl_url();
  std::string out;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK) {
    char *scheme = nullptr, *host = nullptr, *port = nullptr;
    if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
      out = std::string(scheme) + "://" + host + ":" + port;
      for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
  }
  curl_url_cleanup(u);
  return out;
}

// Percent-encodes a repository path segment by segment ('/' kept).
std::string encode_path(std::string_view path) {
  std::string out;
  for (char c : path) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += c;
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", u);
      out += buf;
    }
  }
  return out;
}

struct Response {
  long status = 0;
  std::map<std::string, std::string> headers;  // lowercase names, of the last response
  std::string body;                            // when no sink (or an error status): capped at 1 MiB
  std::string redirect;                        // absolute Location of a 3xx
  CURLcode code = CURLE_OK;
  std::string curl_error;
  int write_errno = 0;  // the sink's errno when it refused bytes
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// Writes a 2xx body's bytes (`status`: the response's, 200 or 206); false
// (errno set) stops the transfer.
using Sink = std::function<bool(const char* data, size_t n, long status)>;

struct Transfer {
  CURL* curl = nullptr;
  Response* r = nullptr;
  const Sink* sink = nullptr;
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string line(data, size * n);
  if (line.starts_with("HTTP/")) {
    t->r->headers.clear();  // a new response (after a 100 Continue)
  } else if (const size_t colon = line.find(':'); colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    t->r->headers[name] = trim(line.substr(colon + 1));
  }
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (t->sink != nullptr && *t->sink && status >= 200 && status < 300) {
    if (!(*t->sink)(data, size * n, status)) {
      t->r->write_errno = errno;
      return 0;  // CURLE_WRITE_ERROR
    }
    return size * n;
  }
  if (t->r->body.size() < (1u << 20)) t->r->body.append(data, std::min(size * n, (size_t(1) << 20)));
  return size * n;
}

// One request, no redirect followed. `token` is sent as a Bearer header when
// not empty (the caller decides the host deserves it).
Response http_once(const std::string& url, bool head, const std::string& token, const std::string& range,
                   const Sink* sink) {
  curl_init_once();
  Response r;
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) {
    r.code = CURLE_FAILED_INIT;
    r.curl_error = "curl_easy_init failed";
    return r;
  }
  Transfer t{curl.get(), &r, sink};
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_slist* headers = nullptr;
  if (!token.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + token).c_str());
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "bonsai/0.1.0");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  // A stalled transfer (under 1 byte/s for 60 s) fails and is resumed.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  if (head) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  if (!range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  r.code = curl_easy_perform(c);
  curl_slist_free_all(headers);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  if (r.code != CURLE_OK) r.curl_error = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(r.code);
  char* location = nullptr;
  if (curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &location) == CURLE_OK && location != nullptr) r.redirect = location;
  return r;
}

// A request that follows up to 10 redirects itself, sending the token only
// to URLs on the endpoint's origin (scheme, host and port): a CDN that a
// redirect leads to never sees it. A HEAD stops at the first redirect that
// carries the Hub's file metadata (X-Linked-Etag) or leaves the endpoint:
// its headers are what head_file reads, its Location where the bytes are.
Response http(std::string url, bool head, const HubOptions& o, const std::string& range = {},
              const Sink* sink = nullptr) {
  const std::string endpoint_origin = origin_of(o.endpoint);
  for (int hop = 0;; ++hop) {
    const bool same = origin_of(url) == endpoint_origin;
    Response r = http_once(url, head, same ? o.token : std::string(), range, sink);
    if (r.code != CURLE_OK || r.status < 300 || r.status >= 400 || r.redirect.empty() || hop == 10) return r;
    // A HEAD keeps the first answer that carries the Hub's file metadata.
    if (head && (!r.header("x-linked-etag").empty() || origin_of(r.redirect) != endpoint_origin)) return r;
    url = r.redirect;
  }
}

// The one-line error of a failed request for `what` (a file, or "the file list").
core::Error http_error(const Response& r, const std::string& repo, const std::string& what, const HubOptions& o) {
  const std::string head = repo + ": " + what + ": ";
  if (r.code != CURLE_OK)
    return {Errc::kIo, head + "cannot reach " + o.endpoint + " (" + r.curl_error +
                           "); check the network, set HF_ENDPOINT to a mirror, or HF_HUB_OFFLINE=1 to use the cache"};
  const std::string code = r.header("x-error-code");
  if (r.status == 401)
    return {Errc::kInvalidArgument,
            head + (o.token.empty() ? "401 Unauthorized: the repository is private or gated, or does not exist; set "
                                      "HF_TOKEN to a token with access"
                                    : "401 Unauthorized: HF_TOKEN was refused; check the token (and that it can read "
                                      "this repository), or that the repository name is right")};
  if (r.status == 403)
    return {Errc::kInvalidArgument,
            head + "403 Forbidden: " +
                (code == "GatedRepo" ? "a gated repository: accept its terms on " + o.endpoint + "/" + repo +
                                           " with the token's account"
                                     : "the token has no access to this repository (HF_TOKEN)")};
  if (r.status == 404) {
    if (code == "EntryNotFound") return {Errc::kNotFound, head + "404: no such file in the repository"};
    if (code == "RevisionNotFound") return {Errc::kNotFound, head + "404: no revision '" + o.revision + "'"};
    return {Errc::kNotFound, head + "404: no repository " + repo + " on " + o.endpoint + " (check the name)"};
  }
  return {Errc::kIo, head + "HTTP " + std::to_string(r.status) + " from " + o.endpoint + "; try again later"};
}

// ---- The cache --------------------------------------------------------------------------

struct RepoCache {
  fs::path root;  // models--owner--name
  fs::path blobs() const { return root / "blobs"; }
  fs::path snapshot(const std::string& commit) const { return root / "snapshots" / commit; }
  fs::path ref(const std::string& revision) const { return root / "refs" / revision; }
};

std::optional<std::string> read_ref(const RepoCache& c, const std::string& revision) {
  if (is_hex64(revision) || (revision.size() == 40 && std::all_of(revision.begin(), revision.end(), [](char ch) {
                               return std::isxdigit(static_cast<unsigned char>(ch));
                             })))
    return revision;  // a commit names its snapshot itself
  std::ifstream in(c.ref(revision));
  std::string commit;
  if (!(in >> commit) || commit.empty()) return std::nullopt;
  return commit;
}

// Files of a snapshot whose links resolve to a complete blob.
std::vector<RepoFile> snapshot_files(const fs::path& snap) {
  std::vector<RepoFile> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(snap, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code ec2;
    if (!fs::is_regular_file(it->path(), ec2)) continue;  // follows the link: a dangling one is skipped
    // Lexically: fs::relative would resolve the link into blobs/.
    const std::string rel = it->path().lexically_relative(snap).generic_string();
    const uint64_t size = fs::file_size(it->path(), ec2);
    if (!ec2 && !rel.empty()) out.push_back({rel, size, {}});
  }
  return out;
}

core::Expected<std::string> sha256_file(const fs::path& p) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (f == nullptr) return fail(Errc::kIo, p.string() + ": " + std::strerror(errno));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<unsigned char> buf(1 << 20);
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) EVP_DigestUpdate(ctx.get(), buf.data(), n);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) return fail(Errc::kIo, p.string() + ": read error");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  char b[3];
  for (unsigned i = 0; i < len; ++i) {
    std::snprintf(b, sizeof b, "%02x", md[i]);
    hex += b;
  }
  return hex;
}

// Writes `text` to `path` through a temporary file and a rename.
core::Expected<void> write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) return fail(Errc::kIo, tmp.string() + ": cannot write");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return fail(Errc::kIo, path.string() + ": " + ec.message());
  return {};
}

// An exclusive flock on a file, released on destruction.
class FileLock {
 public:
  explicit FileLock(const fs::path& p) : fd_(::open(p.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// What HEAD resolve tells about one file.
struct FileMeta {
  std::string commit;
  std::string etag;  // the blob's name (sha256 for LFS)
  uint64_t size = 0;
  std::string url;  // where its bytes are (the CDN redirect, or the resolve URL)
};

std::string clean_etag(std::string e) {
  if (e.starts_with("W/")) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

core::Expected<FileMeta> head_file(const std::string& repo, const std::string& file, const HubOptions& o) {
  const std::string url = o.endpoint + "/" + repo + "/resolve/" + encode_path(o.revision) + "/" + encode_path(file);
  Response r = http(url, /*head=*/true, o);
  if (r.code != CURLE_OK || (r.status >= 400) || r.status < 200) return std::unexpected(http_error(r, repo, file, o));
  FileMeta m;
  m.commit = r.header("x-repo-commit");
  m.etag = clean_etag(!r.header("x-linked-etag").empty() ? r.header("x-linked-etag") : r.header("etag"));
  const std::string size = !r.header("x-linked-size").empty() ? r.header("x-linked-size") : r.header("content-length");
  m.size = std::strtoull(size.c_str(), nullptr, 10);
  m.url = (r.status >= 300 && !r.redirect.empty()) ? r.redirect : url;
  // The ETag names a file in blobs/: letters, digits, '-' and '_' only (the Hub's are hex).
  const bool etag_ok = !m.etag.empty() && std::all_of(m.etag.begin(), m.etag.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
  if (m.commit.empty() || !etag_ok || !std::all_of(m.commit.begin(), m.commit.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c));
      }))
    return fail(Errc::kIo, repo + ": " + file + ": " + o.endpoint +
                               " did not send X-Repo-Commit and an ETag (is HF_ENDPOINT a Hugging Face Hub?)");
  return m;
}

core::Expected<std::vector<RepoFile>> list_repo(const std::string& repo, const HubOptions& o) {
  std::string url = o.endpoint + "/api/models/" + repo + "/tree/" + encode_path(o.revision) + "?recursive=true";
  std::vector<RepoFile> files;
  for (int page = 0; page < 100 && !url.empty(); ++page) {
    Response r = http(url, false, o);
    if (r.code != CURLE_OK || r.status != 200) return std::unexpected(http_error(r, repo, "the file list", o));
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (!j.is_array()) return fail(Errc::kIo, repo + ": the file list from " + o.endpoint + " is not a JSON array");
    for (const auto& e : j) {
      if (!e.is_object() || e.value("type", "") != "file" || !e.contains("path") || !e["path"].is_string()) continue;
      RepoFile f{e["path"].get<std::string>(), e.value("size", uint64_t{0}), {}};
      if (e.contains("lfs") && e["lfs"].is_object()) {
        f.sha256 = e["lfs"].value("oid", "");
        f.size = e["lfs"].value("size", f.size);
      }
      files.push_back(std::move(f));
    }
    // Pagination: Link: <url>; rel="next"
    url.clear();
    const std::string link = r.header("link");
    if (const size_t next = link.find("rel=\"next\""); next != std::string::npos) {
      const size_t open = link.rfind('<', next), close = link.find('>', open);
      if (open != std::string::npos && close != std::string::npos) url = link.substr(open + 1, close - open - 1);
    }
  }
  return files;
}

// Downloads `meta`'s bytes into blobs/{etag} (via .incomplete, resuming),
// checking `sha256` (when known). Holds the blob's lock while it runs.
core::Expected<void> download_blob(const RepoCache& cache, const fs::path& locks, const std::string& repo,
                                   const std::string& file, const FileMeta& meta, const std::string& sha256,
                                   const HubOptions& o, const ProgressFn& progress) {
  const fs::path blob = cache.blobs() / meta.etag;
  const fs::path part = blob.string() + ".incomplete";
  FileLock lock(locks / (meta.etag + ".lock"));
  std::error_code ec;
  if (fs::exists(blob, ec)) return {};  // another process finished it while we waited
  const std::string head = repo + ": " + file + ": ";

  const uint64_t have = fs::exists(part, ec) ? fs::file_size(part, ec) : 0;
  if (struct statvfs sv{}; meta.size > have && ::statvfs(cache.blobs().c_str(), &sv) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
    if (free_bytes < meta.size - have)
      return fail(Errc::kResourceExhausted, head + "needs " + gib(meta.size - have) + " more, " + gib(free_bytes) +
                                                " free in " + cache.blobs().string() +
                                                "; free some space or set HF_HOME to a larger disk");
  }

  std::FILE* f = std::fopen(part.c_str(), "ab");
  if (f == nullptr) return fail(Errc::kIo, head + part.string() + ": " + std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, std::fclose);
  uint64_t done = have;
  uint64_t last_report = 0;
  bool first_chunk = true;
  const Sink sink = [&](const char* data, size_t n, long status) {
    if (std::exchange(first_chunk, false) && status == 200 && done > 0) {
      // The server ignored the range and sends the whole file: start over.
      std::fflush(f);
      if (ftruncate(fileno(f), 0) != 0) return false;
      done = 0;
    }
    if (std::fwrite(data, 1, n, f) != n) return false;
    done += n;
    if (progress && (done - last_report >= (256u << 10) || done == meta.size)) {
      last_report = done;
      progress(file, done, meta.size);
    }
    return true;
  };
  if (progress) progress(file, done, meta.size);
  for (int attempt = 0;; ++attempt) {
    if (meta.size != 0 && done == meta.size) break;
    std::fflush(f);
    const std::string range = done > 0 ? std::to_string(done) + "-" : std::string();
    const uint64_t before = done;
    first_chunk = true;
    Response r = http(meta.url, false, o, range, &sink);
    // Buffered bytes that do not fit on the disk fail here rather than in fwrite.
    if (std::fflush(f) != 0 && r.write_errno == 0) r.write_errno = errno != 0 ? errno : EIO;
    if (r.write_errno != 0 || std::ferror(f)) {
      const int err = r.write_errno != 0 ? r.write_errno : EIO;
      closer.reset();
      fs::remove(part, ec);  // a short write leaves nothing to resume from that can be trusted
      if (err == ENOSPC || err == EDQUOT)
        return fail(Errc::kResourceExhausted, head + "disk full writing " + cache.blobs().string() +
                                                  "; free some space or set HF_HOME to a larger disk");
      return fail(Errc::kIo, head + "cannot write " + part.string() + ": " + std::strerror(err));
    }
    if (r.code == CURLE_OK && r.status == 416) {
      // Range not satisfiable: what we have is not a prefix of this file.
      if (ftruncate(fileno(f), 0) != 0) return fail(Errc::kIo, head + part.string() + ": cannot truncate");
      done = 0;
    } else if (r.code == CURLE_OK && (r.status == 200 || r.status == 206)) {
      if (meta.size == 0 || done == meta.size) break;
      if (done > meta.size) {
        closer.reset();
        fs::remove(part, ec);
        return fail(Errc::kFormat, head + "got " + std::to_string(done) + " bytes, the Hub said " +
                                       std::to_string(meta.size) + "; removed, run it again");
      }
    } else if (r.code == CURLE_OK) {
      return std::unexpected(http_error(r, repo, file, o));
    }
    // A dropped connection (or a short body): resume from what arrived.
    if (attempt >= o.max_retries) {
      if (r.code != CURLE_OK) {
        auto e = http_error(r, repo, file, o);
        e.message +=
            "; " + std::to_string(done) + " of " + std::to_string(meta.size) + " bytes kept, run it again to resume";
        return std::unexpected(e);
      }
      return fail(Errc::kIo, head + "the download stopped at " + std::to_string(done) + " of " +
                                 std::to_string(meta.size) + " bytes; run it again to resume");
    }
    if (done == before)  // no progress: wait a little before the next try
      std::this_thread::sleep_for(std::chrono::milliseconds(200 << std::min(attempt, 5)));
  }
  closer.reset();
  const std::string want = !sha256.empty() ? sha256 : (is_hex64(meta.etag) ? meta.etag : std::string());
  if (!want.empty()) {
    auto got = sha256_file(part);
    if (!got) return std::unexpected(got.error());
    if (*got != want) {
      fs::remove(part, ec);
      return fail(Errc::kFormat, head + "checksum mismatch (sha256 " + *got + ", the Hub says " + want +
                                     "); the download was removed, run it again");
    }
  }
  fs::rename(part, blob, ec);
  if (ec) return fail(Errc::kIo, head + "cannot move the download to " + blob.string() + ": " + ec.message());
  return {};
}

// snapshots/{commit}/{file} -> ../../blobs/{etag} (one more "../" per folder in `file`).
core::Expected<fs::path> link_snapshot(const RepoCache& cache, const std::string& commit, const std::string& file,
                                       const std::string& etag) {
  const fs::path link = cache.snapshot(commit) / file;
  std::error_code ec;
  fs::create_directories(link.parent_path(), ec);
  if (ec) return fail(Errc::kIo, link.parent_path().string() + ": " + ec.message());
  fs::path target;
  for (size_t depth = 0; depth < static_cast<size_t>(std::count(file.begin(), file.end(), '/')) + 2; ++depth)
    target /= "..";
  target = target / "blobs" / etag;
  // A link under a temporary name, renamed over the entry: another process
  // linking the same file at the same time cannot make this one fail.
  const fs::path tmp = link.string() + ".link" + std::to_string(getpid());
  fs::remove(tmp, ec);
  fs::create_symlink(target, tmp, ec);
  if (!ec) fs::rename(tmp, link, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return fail(Errc::kIo, link.string() + ": cannot link to the blob: " + ec.message());
  }
  return link;
}

}  // namespace

core::Expected<HubOptions> options_from_env() {
  HubOptions o;
  fs::path home;
  if (const char* h = env("HF_HOME")) {
    home = h;
  } else {
    const char* xdg = env("XDG_CACHE_HOME");
    const char* user_home = env("HOME");
    home = xdg != nullptr ? fs::path(xdg) / "huggingface"
                          : fs::path(user_home != nullptr ? user_home : "/tmp") / ".cache" / "huggingface";
  }
  o.cache_dir = env("HF_HUB_CACHE") != nullptr ? fs::path(env("HF_HUB_CACHE")) : home / "hub";
  if (const char* e = env("HF_ENDPOINT")) {
    o.endpoint = e;
    while (o.endpoint.ends_with('/')) o.endpoint.pop_back();
  }
  if (const char* t = env("HF_TOKEN")) {
    o.token = trim(t);
  } else {
    std::ifstream in(env("HF_TOKEN_PATH") != nullptr ? fs::path(env("HF_TOKEN_PATH")) : home / "token");
    std::string line;
    if (std::getline(in, line)) o.token = trim(line);
  }
  if (const char* off = env("HF_HUB_OFFLINE")) {
    std::string v = off;
    for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v == "1" || v == "true" || v == "yes" || v == "on")
      o.offline = true;
    else if (!(v == "0" || v == "false" || v == "no" || v == "off"))
      return fail(Errc::kInvalidArgument,
                  "HF_HUB_OFFLINE='" + std::string(off) + "' is not a switch (expected 1 or 0)");
  }
  return o;
}

core::Expected<ModelFiles> fetch_model(const RepoRef& ref, const HubOptions& o, const ProgressFn& progress) {
  const RepoCache cache{o.cache_dir / repo_folder_name(ref.repo)};
  ModelFiles out;
  out.repo = ref.repo;
  // The cache first: the snapshot refs/{revision} names, if it holds the model.
  if (auto commit = read_ref(cache, o.revision); commit && (!o.check_for_update || o.offline)) {
    const auto local = snapshot_files(cache.snapshot(*commit));
    if (auto sel = select_model(ref, local); sel && !local.empty()) {
      out.commit = *commit;
      out.from_cache = true;
      for (const auto& p : sel->parts) out.parts.push_back(cache.snapshot(*commit) / p);
      out.mmproj = sel->mmproj;
      return out;
    } else if (o.offline) {
      return fail(Errc::kNotFound, ref.repo + ": not in the cache (HF_HUB_OFFLINE=1): " +
                                       (sel ? "the snapshot is empty" : sel.error().message) +
                                       "; unset HF_HUB_OFFLINE to download it");
    }
  } else if (o.offline) {
    return fail(Errc::kNotFound, ref.repo + ": not in the cache " + o.cache_dir.string() +
                                     " (HF_HUB_OFFLINE=1); unset HF_HUB_OFFLINE to download it (bonsai pull " +
                                     ref.repo + ")");
  }

  auto files = list_repo(ref.repo, o);
  if (!files) return std::unexpected(files.error());
  auto sel = select_model(ref, *files);
  if (!sel) return std::unexpected(sel.error());
  out.mmproj = sel->mmproj;

  const fs::path locks = o.cache_dir / ".locks" / repo_folder_name(ref.repo);
  std::error_code ec;
  fs::create_directories(cache.blobs(), ec);
  if (!ec) fs::create_directories(cache.root / "refs", ec);
  if (!ec) fs::create_directories(locks, ec);
  if (ec)
    return fail(Errc::kIo, ref.repo + ": cannot create the cache folder " + cache.root.string() + ": " + ec.message() +
                               " (set HF_HOME to a writable folder)");
  for (const std::string& file : sel->parts) {
    auto meta = head_file(ref.repo, file, o);
    if (!meta) return std::unexpected(meta.error());
    if (out.commit.empty()) out.commit = meta->commit;
    std::string sha;
    for (const RepoFile& f : *files)
      if (f.path == file) sha = f.sha256;
    if (!fs::exists(cache.blobs() / meta->etag, ec)) {
      if (auto r = download_blob(cache, locks, ref.repo, file, *meta, sha, o, progress); !r)
        return std::unexpected(r.error());
    }
    auto link = link_snapshot(cache, out.commit, file, meta->etag);
    if (!link) return std::unexpected(link.error());
    out.parts.push_back(*link);
  }
  // refs/{revision} last: a snapshot it names holds complete files only.
  if (!read_ref(cache, o.revision) || *read_ref(cache, o.revision) != out.commit) {
    if (o.revision.find('/') == std::string::npos && !is_hex64(o.revision)) {
      if (auto r = write_atomically(cache.ref(o.revision), out.commit); !r) return std::unexpected(r.error());
    }
  }
  return out;
}

std::vector<CachedFile> list_cached(const HubOptions& o) {
  std::vector<CachedFile> out;
  std::error_code ec;
  for (const auto& dir : fs::directory_iterator(o.cache_dir, ec)) {
    const std::string name = dir.path().filename().string();
    if (!name.starts_with("models--")) continue;
    std::string repo = name.substr(8);
    if (const size_t sep = repo.find("--"); sep != std::string::npos) repo.replace(sep, 2, "/");
    const RepoCache cache{dir.path()};
    const auto main_commit = read_ref(cache, "main");
    std::error_code ec2;
    for (const auto& snap : fs::directory_iterator(dir.path() / "snapshots", ec2)) {
      const std::string commit = snap.path().filename().string();
      const bool current = main_commit && *main_commit == commit;
      // A split model's parts, by the path of its first part.
      std::map<std::string, CachedFile> splits;
      for (RepoFile& f : snapshot_files(snap.path())) {
        if (f.path.size() < 5 || f.path.substr(f.path.size() - 5) != ".gguf") continue;
        const auto split = gguf::parse_split_name(f.path);
        if (!split || split->count == 1) {
          out.push_back({repo, commit, f.path, snap.path() / f.path, f.size, 1, 1, current});
          continue;
        }
        const std::string first = gguf::split_part_name(split->prefix, 1, split->count);
        auto [it, inserted] = splits.try_emplace(first);
        if (inserted) it->second = {repo, commit, first, snap.path() / first, 0, split->count, 0, current};
        it->second.size += f.size;
        ++it->second.parts_present;
      }
      for (auto& [first, model] : splits) out.push_back(std::move(model));
    }
  }
  std::sort(out.begin(), out.end(), [](const CachedFile& a, const CachedFile& b) {
    return std::tie(a.repo, a.path, a.commit) < std::tie(b.repo, b.path, b.commit);
  });
  return out;
}

}  // namespace bonsai::hub
