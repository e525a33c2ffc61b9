// The networks the controller dials agents in (--agent-networks): a
// Register naming an agent address outside them is refused before the
// controller connects to it, so a caller cannot point the controller (and
// the training state it sends) at an arbitrary host (docs/controller.md,
// "Agent identity").
#ifndef ARACHNE_CONTROLLER_AGENT_NETWORKS_H_
#define ARACHNE_CONTROLLER_AGENT_NETWORKS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace arachne::controller {

// One CIDR block, IPv4 or IPv6 (an IPv4-mapped IPv6 address is read as
// the IPv4 one).
struct IpNetwork {
  bool v6 = false;
  std::array<uint8_t, 16> bytes{};  // the first 4 for IPv4
  int prefix = 0;                   // bits
  std::string ToString() const;     // "10.0.0.0/8"
};

class AgentNetworks {
 public:
  // At most this many blocks in one list.
  static constexpr int kMaxNetworks = 256;

  // A comma-separated list of CIDR blocks ("10.0.0.0/8, fd00::/8"; a bare
  // address is a /32 or /128). InvalidArgument naming `field` and quoting
  // the entry for an entry that is not one, host bits set, or an empty list.
  static absl::StatusOr<AgentNetworks> Parse(absl::string_view spec,
                                             absl::string_view field);
  // The loopback networks (127.0.0.0/8, ::1/128) and the network of every
  // address of this machine's interfaces.
  static AgentNetworks Default();

  // OK when the host of `address` ("host:port", "[v6]:port") is an address
  // inside one of the networks, or a name all of whose addresses are.
  // PermissionDenied naming the address and the networks otherwise;
  // Unavailable when a name does not resolve; InvalidArgument when
  // `address` has no host or port.
  absl::Status Check(absl::string_view address) const;

  bool Contains(const IpNetwork& address) const;  // a /32 or /128
  const std::vector<IpNetwork>& networks() const { return networks_; }
  std::string ToString() const;  // "127.0.0.0/8, ::1/128"

 private:
  std::vector<IpNetwork> networks_;
};

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_AGENT_NETWORKS_H_
