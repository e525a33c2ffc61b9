// The point-to-point transport a migration runs over, and the factory each
// backend (migration/gloo, migration/nccl) provides. A binary links the
// backends it was built with and asks each factory IsViable() at run time,
// so one binary runs on GPU and CPU-only machines.
#ifndef ARACHNE_MIGRATION_CORE_TRANSPORT_H_
#define ARACHNE_MIGRATION_CORE_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "migration/core/rendezvous_store.h"

namespace arachne::migration {

// Where the buffers handed to a transport live.
enum class MemoryKind { kHost, kDevice };

struct SendOp {
  int peer = 0;
  const void* data = nullptr;
  size_t bytes = 0;
};
struct RecvOp {
  int peer = 0;
  void* data = nullptr;
  size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Memory the op buffers must be in.
  virtual MemoryKind memory() const = 0;
  // Runs one round: posts every send and receive, returns when all are
  // complete. `tag` names the round and must be the same on both ends; the
  // k-th op to a peer in a round matches that peer's k-th op from this rank
  // in the same round, and both must have the same size. Errors:
  // DeadlineExceeded when the round did not finish within `timeout`,
  // Unavailable when a peer or the network failed, InvalidArgument for a
  // peer outside the world. After an error the transport is unusable.
  virtual absl::Status RunRound(uint64_t tag, absl::Span<const SendOp> sends,
                                absl::Span<const RecvOp> recvs,
                                absl::Duration timeout) = 0;
};

struct TransportConfig {
  int rank = 0;
  int world_size = 1;
  // Namespace of this group's keys in the store (e.g. the generation).
  std::string store_prefix = "migration";
  absl::Duration connect_timeout = absl::Seconds(30);
  // Gloo: the address to listen on.
  std::string hostname = "127.0.0.1";
  // NCCL: CUDA device of this rank; -1 picks rank % device count.
  int device = -1;
  // NCCL: kHost stages host buffers through device memory; kDevice takes
  // device pointers as they are.
  MemoryKind memory = MemoryKind::kHost;
  // NCCL with kHost: the size of the one pinned host buffer and the one
  // device buffer a round is staged through (each allocated once, at
  // connect). A round larger than that runs as several NCCL groups, each
  // staging at most this many bytes (migration/nccl/staged_round.h has the
  // rule). Must be in [4 KiB, 64 GiB] and at least 512 * world_size bytes
  // (InvalidArgument otherwise), and the same on every rank (checked at
  // connect: FailedPrecondition). Unused by Gloo and by NCCL with kDevice.
  size_t staging_bytes = size_t{64} << 20;
};

class TransportFactory {
 public:
  virtual ~TransportFactory() = default;
  virtual std::string name() const = 0;
  // Whether this machine can run the backend (e.g. a GPU is present).
  virtual bool IsViable() const = 0;
  // How many ranks of this backend one machine can host (NCCL: one per
  // GPU); tests with more ranks skip.
  virtual int MaxLocalRanks() const { return 1 << 20; }
  // Connects `config.world_size` ranks through `store`; every rank calls it.
  virtual absl::StatusOr<std::unique_ptr<Transport>> Create(
      const TransportConfig& config, RendezvousStore* store) const = 0;
};

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_CORE_TRANSPORT_H_
