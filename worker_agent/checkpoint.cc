#include "worker_agent/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <iterator>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker_agent/checkpoint_io.h"

namespace arachne::agent {
namespace {

using migration::ByteRange;
using migration::Holding;

constexpr char kMagic[8] = {'A', 'R', 'C', 'K', 'P', 'T', '1', '\n'};

struct Piece {
  int tensor;
  ByteRange range;
  const uint8_t* data;
};

absl::StatusOr<FullState> Assemble(const migration::ModelState& state,
                                   const std::vector<Piece>& pieces) {
  FullState full;
  full.tensors.resize(state.num_tensors());
  std::vector<std::vector<bool>> have(state.num_tensors());
  for (int id = 0; id < state.num_tensors(); ++id) {
    full.tensors[id].assign(state.tensor(id).bytes(), 0);
    have[id].assign(state.tensor(id).bytes(), false);
  }
  for (const Piece& p : pieces) {
    std::vector<uint8_t>& t = full.tensors[p.tensor];
    std::vector<bool>& h = have[p.tensor];
    for (int64_t o = p.range.begin; o < p.range.end; ++o) {
      const uint8_t b = p.data[o - p.range.begin];
      if (h[o] && t[o] != b) {
        return absl::DataLossError(absl::StrCat(
            "tensor '", state.tensor(p.tensor).name, "' byte ", o,
            ": two holders disagree (", int{t[o]}, " vs ", int{b}, ")"));
      }
      t[o] = b;
      h[o] = true;
    }
  }
  for (int id = 0; id < state.num_tensors(); ++id) {
    for (size_t o = 0; o < have[id].size(); ++o) {
      if (!have[id][o]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "no shard holds byte ", o, " of tensor '", state.tensor(id).name,
            "'"));
      }
    }
  }
  return full;
}

std::string ShardFileName(const migration::GpuId& gpu) {
  std::string node;
  for (char c : gpu.node) {
    node += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')
                ? c
                : '.';
  }
  return absl::StrCat("shard-", node, "-", gpu.index, ".bin");
}

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace

absl::StatusOr<FullState> AssembleState(
    const migration::ModelState& state,
    const std::vector<const migration::ShardSet*>& shards) {
  std::vector<Piece> pieces;
  for (const migration::ShardSet* s : shards) {
    for (const Holding& h : s->holdings()) {
      pieces.push_back({h.tensor, h.range, s->Find(h.tensor, h.range)});
    }
  }
  return Assemble(state, pieces);
}

void FillFromState(const FullState& full, migration::ShardSet* out) {
  for (const Holding& h : out->holdings()) {
    uint8_t* to = out->Find(h.tensor, h.range);
    CHECK(to != nullptr);
    std::memcpy(to, full.tensors[h.tensor].data() + h.range.begin,
                static_cast<size_t>(h.range.size()));
  }
}

std::string FirstDifference(const migration::ModelState& state,
                            const FullState& a, const FullState& b) {
  if (a.tensors.size() != b.tensors.size()) {
    return absl::StrCat(a.tensors.size(), " tensors vs ", b.tensors.size());
  }
  for (size_t id = 0; id < a.tensors.size(); ++id) {
    if (a.tensors[id] == b.tensors[id]) continue;
    const size_t n = std::min(a.tensors[id].size(), b.tensors[id].size());
    size_t o = 0;
    while (o < n && a.tensors[id][o] == b.tensors[id][o]) ++o;
    return absl::StrCat("tensor '", state.tensor(id).name, "' byte ", o);
  }
  return "";
}

absl::Status WriteCheckpointShard(const std::string& dir,
                                  const migration::ModelState& state,
                                  const migration::GpuId& gpu,
                                  const migration::ShardSet& shards) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::Status(
        CheckpointIoCode(ec),
        absl::StrCat("checkpoint_dir ", dir, ": cannot create: ", ec.message()));
  }
  std::string out(kMagic, sizeof(kMagic));
  Put<uint32_t>(out, static_cast<uint32_t>(shards.holdings().size()));
  for (const Holding& h : shards.holdings()) {
    const std::string& name = state.tensor(h.tensor).name;
    const uint8_t* data = shards.Find(h.tensor, h.range);
    Put<uint32_t>(out, static_cast<uint32_t>(name.size()));
    out += name;
    Put<int64_t>(out, h.range.begin);
    Put<int64_t>(out, h.range.end);
    Put<uint64_t>(out, migration::Checksum(data, h.range.size()));
    out.append(reinterpret_cast<const char*>(data),
               static_cast<size_t>(h.range.size()));
  }
  const std::string path = (std::filesystem::path(dir) / ShardFileName(gpu)).string();
  const std::string tmp = path + ".tmp";
  // POSIX calls rather than a stream, for the errno that tells a permanent
  // failure (no permission, read-only, no space) from a transient one.
  auto failed = [&](const char* what, int err) {
    std::remove(tmp.c_str());
    return absl::Status(
        CheckpointIoCode(err),
        absl::StrCat("checkpoint: cannot ", what, " ", tmp, ": ",
                     std::generic_category().message(err)));
  };
  {
    const int fd =
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return failed("create", errno);
    size_t at = 0;
    while (at < out.size()) {
      const ssize_t n = ::write(fd, out.data() + at, out.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        return failed("write", err);
      }
      at += static_cast<size_t>(n);
    }
    if (::close(fd) != 0 && errno != EINTR) return failed("write", errno);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::Status(
        CheckpointIoCode(err),
        absl::StrCat("checkpoint: cannot rename ", tmp, " to ", path, ": ",
                     std::generic_category().message(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<FullState> ReadCheckpoint(const std::string& dir,
                                         const migration::ModelState& state) {
  absl::flat_hash_map<std::string, int> id_of;
  for (int id = 0; id < state.num_tensors(); ++id) {
    id_of[state.tensor(id).name] = id;
  }
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("shard-", 0) == 0 && n.size() > 4 &&
        n.substr(n.size() - 4) == ".bin") {
      files.push_back(e.path().string());
    }
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::Status(CheckpointIoCode(ec),
                        absl::StrCat("checkpoint_dir ", dir,
                                     ": cannot read: ", ec.message()));
  }
  if (ec || files.empty()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint_dir ", dir, ": no shard files"));
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> contents;
  contents.reserve(files.size());
  std::vector<Piece> pieces;
  for (const std::string& path : files) {
    std::ifstream f(path, std::ios::binary);
    contents.emplace_back((std::istreambuf_iterator<char>(f)),
                          std::istreambuf_iterator<char>());
    const std::string& c = contents.back();
    size_t at = 0;
    auto truncated = [&]() {
      return absl::DataLossError(absl::StrCat(path, ": truncated at byte ", at));
    };
    auto get = [&](void* v, size_t n) {
      if (at + n > c.size()) return false;
      std::memcpy(v, c.data() + at, n);
      at += n;
      return true;
    };
    char magic[8];
    if (!get(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": not an Arachne checkpoint shard"));
    }
    uint32_t count = 0;
    if (!get(&count, 4)) return truncated();
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t len = 0;
      if (!get(&len, 4) || at + len > c.size()) return truncated();
      const std::string name = c.substr(at, len);
      at += len;
      int64_t begin = 0, end = 0;
      uint64_t sum = 0;
      if (!get(&begin, 8) || !get(&end, 8) || !get(&sum, 8)) return truncated();
      auto it = id_of.find(name);
      if (it == id_of.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, ": tensor '", name, "' is not part of model ",
            state.model().name));
      }
      if (begin < 0 || end < begin || end > state.tensor(it->second).bytes() ||
          at + static_cast<size_t>(end - begin) > c.size()) {
        return absl::DataLossError(absl::StrCat(
            path, ": tensor '", name, "' range [", begin, ", ", end,
            ") is out of bounds or truncated"));
      }
      const uint8_t* data = reinterpret_cast<const uint8_t*>(c.data() + at);
      if (migration::Checksum(data, end - begin) != sum) {
        return absl::DataLossError(absl::StrCat(
            path, ": tensor '", name, "' bytes [", begin, ", ", end,
            "): checksum mismatch"));
      }
      pieces.push_back({it->second, {begin, end}, data});
      at += end - begin;
    }
  }
  return Assemble(state, pieces);
}

}  // namespace arachne::agent
