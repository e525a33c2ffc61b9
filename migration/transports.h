// The transports this build has, by name ("gloo", "nccl"), so a worker can
// pick one from its configuration and fall back when one is not viable.
#ifndef ARACHNE_MIGRATION_TRANSPORTS_H_
#define ARACHNE_MIGRATION_TRANSPORTS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "migration/core/transport.h"

namespace arachne::migration {

// Names of the transports built in, in order of preference (NCCL first).
std::vector<std::string> TransportNames();

// The factory named `name`; NotFound naming the value and the built-in
// transports when it is not built in.
absl::StatusOr<std::unique_ptr<TransportFactory>> MakeTransportFactory(
    absl::string_view name);

// The first built-in transport whose IsViable() holds here; NotFound when
// none is (no backend built in).
absl::StatusOr<std::unique_ptr<TransportFactory>> MakeViableTransportFactory();

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_TRANSPORTS_H_
