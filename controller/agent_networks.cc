#include "controller/agent_networks.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner_service/io/json_yaml.h"

namespace arachne::controller {
namespace {

int Bits(const IpNetwork& n) { return n.v6 ? 128 : 32; }

// Clears the bits past `prefix`.
IpNetwork Masked(IpNetwork n, int prefix) {
  n.prefix = prefix;
  for (int bit = prefix; bit < Bits(n); ++bit) {
    n.bytes[bit / 8] &= static_cast<uint8_t>(~(0x80u >> (bit % 8)));
  }
  return n;
}

// An IPv4-mapped IPv6 address (::ffff:a.b.c.d) reads as a.b.c.d.
IpNetwork FromV6(const in6_addr& a) {
  IpNetwork n;
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(a.s6_addr, kMapped, 12) == 0) {
    std::memcpy(n.bytes.data(), a.s6_addr + 12, 4);
    n.prefix = 32;
    return n;
  }
  n.v6 = true;
  std::memcpy(n.bytes.data(), a.s6_addr, 16);
  n.prefix = 128;
  return n;
}

IpNetwork FromV4(const in_addr& a) {
  IpNetwork n;
  std::memcpy(n.bytes.data(), &a.s_addr, 4);
  n.prefix = 32;
  return n;
}

// A literal address, or nullopt.
std::optional<IpNetwork> ParseAddress(const std::string& text) {
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return FromV4(v4);
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) return FromV6(v6);
  return std::nullopt;
}

// The prefix length a netmask has (its leading ones).
int PrefixOf(const sockaddr* mask) {
  const uint8_t* b;
  int bytes;
  if (mask->sa_family == AF_INET) {
    b = reinterpret_cast<const uint8_t*>(
        &reinterpret_cast<const sockaddr_in*>(mask)->sin_addr);
    bytes = 4;
  } else {
    b = reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr.s6_addr;
    bytes = 16;
  }
  int prefix = 0;
  for (int i = 0; i < bytes && b[i] != 0; ++i) {
    for (int bit = 7; bit >= 0 && (b[i] >> bit & 1); --bit) ++prefix;
    if (b[i] != 0xff) break;
  }
  return prefix;
}

}  // namespace

std::string IpNetwork::ToString() const {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(v6 ? AF_INET6 : AF_INET, bytes.data(), text, sizeof(text));
  return absl::StrCat(text, "/", prefix);
}

absl::StatusOr<AgentNetworks> AgentNetworks::Parse(absl::string_view spec,
                                                   absl::string_view field) {
  AgentNetworks out;
  for (absl::string_view entry : absl::StrSplit(spec, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", QuoteForMessage(entry), " ", why,
          " (want comma-separated CIDR blocks, e.g. 10.0.0.0/8, fd00::/8)"));
    };
    if (entry.empty()) return bad("is empty");
    if (static_cast<int>(out.networks_.size()) == kMaxNetworks) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": at most ", kMaxNetworks, " networks"));
    }
    const size_t slash = entry.find('/');
    std::optional<IpNetwork> n =
        ParseAddress(std::string(entry.substr(0, slash)));
    if (!n.has_value()) return bad("is not an IPv4 or IPv6 address");
    int prefix = Bits(*n);
    if (slash != absl::string_view::npos &&
        (!absl::SimpleAtoi(entry.substr(slash + 1), &prefix) || prefix < 0 ||
         prefix > Bits(*n))) {
      return bad(absl::StrCat("has no prefix length in 0..", Bits(*n)));
    }
    const IpNetwork masked = Masked(*n, prefix);
    if (masked.bytes != n->bytes) {
      return bad(absl::StrCat("has host bits set (the network is ",
                              masked.ToString(), ")"));
    }
    out.networks_.push_back(masked);
  }
  return out;
}

AgentNetworks AgentNetworks::Default() {
  AgentNetworks out = *Parse("127.0.0.0/8, ::1/128", "default");
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    const IpNetwork address =
        family == AF_INET
            ? FromV4(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr)
            : FromV6(reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    const IpNetwork network = Masked(address, PrefixOf(i->ifa_netmask));
    bool have = false;
    for (const IpNetwork& n : out.networks_) {
      have |= n.v6 == network.v6 && n.bytes == network.bytes &&
              n.prefix == network.prefix;
    }
    if (!have) out.networks_.push_back(network);
  }
  freeifaddrs(list);
  return out;
}

bool AgentNetworks::Contains(const IpNetwork& address) const {
  for (const IpNetwork& n : networks_) {
    if (n.v6 != address.v6) continue;
    if (Masked(address, n.prefix).bytes == n.bytes) return true;
  }
  return false;
}

std::string AgentNetworks::ToString() const {
  return absl::StrJoin(networks_, ", ", [](std::string* out, const IpNetwork& n) {
    absl::StrAppend(out, n.ToString());
  });
}

absl::Status AgentNetworks::Check(absl::string_view address) const {
  // host:port, or [v6]:port.
  std::string host;
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 ||
      colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address: must be host:port, got ", QuoteForMessage(address)));
  }
  host = std::string(address.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::vector<IpNetwork> resolved;
  if (std::optional<IpNetwork> literal = ParseAddress(host)) {
    resolved.push_back(*literal);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &list);
        rc != 0) {
      return absl::UnavailableError(absl::StrCat(
          "address: host ", QuoteForMessage(host), " does not resolve (",
          gai_strerror(rc), ")"));
    }
    for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
      if (a->ai_family == AF_INET) {
        resolved.push_back(
            FromV4(reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr));
      } else if (a->ai_family == AF_INET6) {
        resolved.push_back(
            FromV6(reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr));
      }
    }
    freeaddrinfo(list);
  }
  for (const IpNetwork& a : resolved) {
    if (!Contains(a)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "address: ", QuoteForMessage(address),
          resolved.size() > 1 || !ParseAddress(host).has_value()
              ? absl::StrCat(" (", a.ToString().substr(0, a.ToString().find('/')), ")")
              : "",
          " is outside the networks the controller dials agents in "
          "(--agent-networks: ",
          ToString().substr(0, 512), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace arachne::controller
