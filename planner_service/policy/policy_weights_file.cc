#include "planner_service/policy/policy_weights_file.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace arachne {
namespace {

constexpr size_t kMagicSize = 8;
constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t Fnv1a(const char* data, size_t size) {
  uint64_t h = kFnvOffset;
  for (size_t i = 0; i < size; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= kFnvPrime;
  }
  return h;
}

void PutU32(std::string* out, uint32_t v) {
  for (int b = 0; b < 4; ++b) out->push_back(static_cast<char>(v >> (8 * b)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int b = 0; b < 8; ++b) out->push_back(static_cast<char>(v >> (8 * b)));
}
void PutFloats(std::string* out, const std::vector<float>& values) {
  for (float f : values) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    PutU32(out, bits);
  }
}
void PutLayer(std::string* out, const InferenceLayer& layer) {
  PutU32(out, static_cast<uint32_t>(layer.in));
  PutU32(out, static_cast<uint32_t>(layer.out));
  PutFloats(out, layer.weight_t);
  PutFloats(out, layer.bias);
}

// Reads the bytes [pos, end) of a weights file; every read checks that the
// bytes are there.
class Reader {
 public:
  Reader(const std::string& bytes, size_t end, const std::string& source)
      : bytes_(bytes), end_(end), source_(source) {}
  size_t left() const { return end_ - pos_; }
  absl::Status Need(size_t n, const std::string& what) const {
    if (n > left()) {
      return absl::DataLossError(absl::StrCat(
          source_, ": truncated policy weights file (", what, " needs ", n,
          " bytes at offset ", pos_, ", ", left(), " left)"));
    }
    return absl::OkStatus();
  }
  uint32_t U32() {
    uint32_t v = 0;
    for (int b = 0; b < 4; ++b)
      v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes_[pos_ + b]))
           << (8 * b);
    pos_ += 4;
    return v;
  }
  void Floats(size_t n, std::vector<float>* out) {
    out->resize(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bits = U32();
      std::memcpy(&(*out)[i], &bits, 4);
    }
  }
  std::string Bytes(size_t n) {
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  const std::string& bytes_;
  size_t end_;
  size_t pos_ = 0;
  const std::string& source_;
};

struct LayerShape {
  std::string name;
  int in, out;
};

std::vector<LayerShape> ExpectedLayers(const PolicyNetworkConfig& c) {
  std::vector<LayerShape> shapes;
  const int film_params = 2 * c.hidden * c.layers + 2 * c.head_hidden * 3;
  shapes.push_back({"film_in", PolicyConditioningInputs(c), c.film_hidden});
  shapes.push_back({"film_out", c.film_hidden, film_params});
  int in = PolicyStateInputs(c);
  for (int l = 0; l < c.layers; ++l) {
    shapes.push_back({absl::StrCat("backbone", l), in, c.hidden});
    in = c.hidden;
  }
  for (int h = 0; h < 3; ++h)
    shapes.push_back(
        {absl::StrCat("head_in", h), c.hidden + kHeadFeatures[h], c.head_hidden});
  for (int h = 0; h < 3; ++h)
    shapes.push_back({absl::StrCat("head_out", h), c.head_hidden, 1});
  return shapes;
}

absl::Status CheckNetworkSize(const char* field, int value,
                              const std::string& source) {
  if (value < 1 || value > 4096) {
    return absl::DataLossError(
        absl::StrCat(source, ": policy weights file metadata: network.", field,
                     " must be in [1, 4096], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

std::string WeightsFilePath(const std::string& checkpoint) {
  std::filesystem::path p(checkpoint);
  p.replace_extension(".weights");
  return p.string();
}

std::string SerializePolicyWeights(const PolicyCheckpointInfo& info,
                                   const PolicyWeights& weights) {
  PolicyCheckpointInfo meta = info;
  meta.network = weights.config;
  const std::string json = CheckpointInfoToJson(meta);
  std::string out(kPolicyWeightsMagic, kMagicSize);
  PutU32(&out, static_cast<uint32_t>(json.size()));
  out += json;
  PutLayer(&out, weights.film_in);
  PutLayer(&out, weights.film_out);
  for (const InferenceLayer& layer : weights.backbone) PutLayer(&out, layer);
  for (const InferenceLayer& layer : weights.head_in) PutLayer(&out, layer);
  for (const InferenceLayer& layer : weights.head_out) PutLayer(&out, layer);
  PutU64(&out, Fnv1a(out.data(), out.size()));
  return out;
}

absl::Status WritePolicyWeightsFile(const PolicyCheckpointInfo& info,
                                    const PolicyWeights& weights,
                                    const std::string& path) {
  const std::string bytes = SerializePolicyWeights(info, weights);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f.good()) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return absl::InternalError(
          absl::StrCat("cannot write policy weights file ", path));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::InternalError(absl::StrCat(
        "cannot write policy weights file ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedPolicyWeights> ParsePolicyWeights(
    const std::string& bytes, const std::string& source) {
  if (bytes.size() < kMagicSize ||
      std::memcmp(bytes.data(), kPolicyWeightsMagic, kMagicSize) != 0) {
    return absl::DataLossError(absl::StrCat(
        source, ": not an arachne policy weights file (no \"",
        kPolicyWeightsMagic, "\" magic)"));
  }
  if (bytes.size() < kMagicSize + 4 + 8) {
    return absl::DataLossError(absl::StrCat(
        source, ": truncated policy weights file (", bytes.size(), " bytes)"));
  }
  const size_t body = bytes.size() - 8;
  uint64_t stored = 0;
  for (int b = 0; b < 8; ++b)
    stored |= static_cast<uint64_t>(
                  static_cast<unsigned char>(bytes[body + b]))
              << (8 * b);
  Reader r(bytes, body, source);
  r.Bytes(kMagicSize);
  const uint32_t json_size = r.U32();
  // Sizes first, so a truncated file says so rather than "bad checksum".
  if (absl::Status s = r.Need(json_size, "the metadata"); !s.ok()) return s;
  const std::string json = r.Bytes(json_size);
  absl::StatusOr<PolicyCheckpointInfo> info = ParseCheckpointInfo(json, source);
  if (!info.ok()) {
    // A checksum mismatch is the likelier cause when the metadata is bad.
    if (Fnv1a(bytes.data(), body) != stored) {
      return absl::DataLossError(absl::StrCat(
          source, ": policy weights file checksum mismatch (corrupted)"));
    }
    return absl::DataLossError(info.status().message());
  }
  if (info->format_version != kPolicyFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        source, ": checkpoint format version ", info->format_version,
        ", this build reads version ", kPolicyFormatVersion, "; retrain it"));
  }
  const PolicyNetworkConfig& c = info->network;
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"hidden", c.hidden},
        {"layers", c.layers},
        {"head_hidden", c.head_hidden},
        {"film_hidden", c.film_hidden}}) {
    if (absl::Status s = CheckNetworkSize(field, value, source); !s.ok())
      return s;
  }
  auto weights = std::make_shared<PolicyWeights>();
  weights->config = c;
  std::vector<InferenceLayer> layers;
  for (const LayerShape& shape : ExpectedLayers(c)) {
    if (absl::Status s = r.Need(8, "layer " + shape.name); !s.ok()) return s;
    const uint32_t in = r.U32();
    const uint32_t out = r.U32();
    if (in != static_cast<uint32_t>(shape.in) ||
        out != static_cast<uint32_t>(shape.out)) {
      return absl::DataLossError(absl::StrCat(
          source, ": policy weights file layer ", shape.name, " is ", in, "x",
          out, ", the metadata's network needs ", shape.in, "x", shape.out));
    }
    const size_t floats = static_cast<size_t>(in) * out + out;
    if (absl::Status s = r.Need(floats * 4, "layer " + shape.name); !s.ok())
      return s;
    InferenceLayer layer;
    layer.in = shape.in;
    layer.out = shape.out;
    r.Floats(static_cast<size_t>(in) * out, &layer.weight_t);
    r.Floats(out, &layer.bias);
    layers.push_back(std::move(layer));
  }
  if (r.left() != 0) {
    return absl::DataLossError(
        absl::StrCat(source, ": policy weights file has ", r.left(),
                     " bytes after the last layer"));
  }
  if (Fnv1a(bytes.data(), body) != stored) {
    return absl::DataLossError(absl::StrCat(
        source, ": policy weights file checksum mismatch (corrupted)"));
  }
  size_t next = 0;
  weights->film_in = std::move(layers[next++]);
  weights->film_out = std::move(layers[next++]);
  for (int l = 0; l < c.layers; ++l)
    weights->backbone.push_back(std::move(layers[next++]));
  for (int h = 0; h < 3; ++h) weights->head_in[h] = std::move(layers[next++]);
  for (int h = 0; h < 3; ++h) weights->head_out[h] = std::move(layers[next++]);
  weights->version = PolicyWeights::NextVersion();
  return LoadedPolicyWeights{*std::move(info), std::move(weights)};
}

absl::StatusOr<LoadedPolicyWeights> ReadPolicyWeightsFile(
    const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  }
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)),
                    std::istreambuf_iterator<char>());
  if (f.bad()) {
    return absl::DataLossError(absl::StrCat(path, ": cannot read"));
  }
  return ParsePolicyWeights(bytes, path);
}

}  // namespace arachne
