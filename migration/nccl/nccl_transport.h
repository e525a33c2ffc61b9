// NCCL point-to-point (ncclSend / ncclRecv inside ncclGroupStart/End) over
// one communicator whose unique id rank 0 publishes in the RendezvousStore.
// Built only with CUDA and NCCL (ARACHNE_HAVE_NCCL).
//
// Memory: with TransportConfig::memory == kDevice the op buffers are device
// pointers on this rank's GPU; with kHost the transport stages them through
// a device buffer (what the executor and the conformance suite use). NCCL
// matches the ops to one peer in order, so the round tag is only checked by
// the caller's schedule, not on the wire.
#ifndef ARACHNE_MIGRATION_NCCL_NCCL_TRANSPORT_H_
#define ARACHNE_MIGRATION_NCCL_NCCL_TRANSPORT_H_

#include <memory>

#include "migration/core/transport.h"

namespace arachne::migration {

// name() "nccl"; IsViable() when the CUDA runtime sees at least one GPU;
// MaxLocalRanks() the number of GPUs (NCCL takes one rank per GPU).
std::unique_ptr<TransportFactory> MakeNcclTransportFactory();

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_NCCL_NCCL_TRANSPORT_H_
