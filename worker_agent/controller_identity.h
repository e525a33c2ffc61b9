// How an agent tells its controller's commands from anyone else's: the
// controller (controller/state_database.h ControllerId) sends its identity
// as call metadata on every Agent RPC; an agent registered with it
// (registration.h) accepts commands carrying it only (agent_service.h).
#ifndef ARACHNE_WORKER_AGENT_CONTROLLER_IDENTITY_H_
#define ARACHNE_WORKER_AGENT_CONTROLLER_IDENTITY_H_

#include "absl/strings/string_view.h"

namespace arachne::agent {

inline constexpr absl::string_view kControllerIdMetadata =
    "x-arachne-controller-id";

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_CONTROLLER_IDENTITY_H_
