// Gloo over TCP: the migration transport for host memory, used on CPU-only
// machines and by the tests (ranks as processes on loopback).
#ifndef ARACHNE_MIGRATION_GLOO_GLOO_TRANSPORT_H_
#define ARACHNE_MIGRATION_GLOO_GLOO_TRANSPORT_H_

#include <memory>

#include "migration/core/transport.h"

namespace arachne::migration {

// name() "gloo"; always viable. Create() listens on config.hostname,
// publishes its address in the store under config.store_prefix and connects
// to every other rank (a full mesh), and returns once every rank is
// connected; Unavailable or DeadlineExceeded after config.connect_timeout.
std::unique_ptr<TransportFactory> MakeGlooTransportFactory();

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_GLOO_GLOO_TRANSPORT_H_
