// NCCL point-to-point (ncclSend / ncclRecv inside ncclGroupStart/End) over
// one communicator whose unique id rank 0 publishes in the RendezvousStore.
// Built only with CUDA and NCCL >= 2.14 (ARACHNE_HAVE_NCCL).
//
// Nothing blocks without a deadline. The communicator is created
// non-blocking (ncclCommInitRankConfig, blocking = 0) and polled with
// ncclCommGetAsyncError under TransportConfig::connect_timeout, so a peer
// that never joins makes Create return DeadlineExceeded (naming rank, world
// size and store prefix) instead of hanging. ncclGroupEnd, a round's stream
// and finalize are polled the same way (migration/nccl/deadline_poll.h)
// under the round's timeout.
//
// Failure aborts before returning. On a round timeout, a CUDA error or an
// NCCL error (a peer's async error included) RunRound calls ncclCommAbort
// and waits (at most 10 s) for the stream to drain, all before it returns:
// no NCCL kernel writes into a buffer after RunRound returned. From then on
// every RunRound is refused with FailedPrecondition naming that first
// error. A healthy transport's destructor finalizes and destroys the
// communicator (ncclCommFinalize, polled, then ncclCommDestroy).
//
// Memory: with TransportConfig::memory == kHost the op buffers are host
// memory, staged through one pinned host buffer and one device buffer of
// TransportConfig::staging_bytes each, allocated once at connect; a round
// larger than that runs as several NCCL groups cut by the rule in
// migration/nccl/staged_round.h (both ends of every pair cut alike, so the
// sub-rounds cannot deadlock; each stages at most staging_bytes). NCCL
// kernels only ever write the staging buffers; the caller's host buffers
// are copied on the CPU after a sub-round completed. The memory kind, and
// with kHost staging_bytes, must be the same on every rank; rank 0
// publishes its own with the unique id and the others refuse a mismatch
// (FailedPrecondition). With kDevice the op buffers are device pointers on
// this rank's GPU and go to NCCL as they are (one group per round, no
// staging, on the transport's own stream: the caller has them ready, e.g.
// synchronised, before RunRound); checksums of device memory are the
// executor's job, not the transport's.
//
// NCCL matches the ops to one peer in order, so the round tag is only
// checked by the caller's schedule, not on the wire; it names the round in
// error messages. Zero-byte ops post nothing.
#ifndef ARACHNE_MIGRATION_NCCL_NCCL_TRANSPORT_H_
#define ARACHNE_MIGRATION_NCCL_NCCL_TRANSPORT_H_

#include <memory>

#include "migration/core/transport.h"

namespace arachne::migration {

// name() "nccl"; IsViable() when the CUDA runtime sees at least one GPU;
// MaxLocalRanks() the number of GPUs (NCCL takes one rank per GPU).
// Create() checks rank, world size and (kHost) staging_bytes before any
// CUDA call: InvalidArgument.
std::unique_ptr<TransportFactory> MakeNcclTransportFactory();

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_NCCL_NCCL_TRANSPORT_H_
