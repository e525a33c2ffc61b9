// A client of a running `arachne-planner`, in the project's own types (the
// queries and answers of planner_handler.h), so that callers such as the
// `arachne` CLI include no gRPC or protobuf header: the gRPC implementation
// lives in planner_client.cc behind MakeGrpcPlannerClient.
//
// Answers carry plans in the CLI's plan JSON format (plan_io.h) with the
// prediction at the top level, exactly as PlannerHandler answers them, so a
// remote plan prints like an in-process one.
#ifndef ARACHNE_PLANNER_SERVICE_CLIENT_PLANNER_CLIENT_H_
#define ARACHNE_PLANNER_SERVICE_CLIENT_PLANNER_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/model/plan.h"
#include "planner_service/api/planner_handler.h"

namespace arachne {

struct PlannerClientConfig {
  std::string address;  // host:port of arachne-planner
  // Sent as `authorization: Bearer <token>` on every call when not empty.
  std::string token;
  // TLS when not empty: trust these CA certificates (PEM file) for the
  // server's certificate. Empty: plaintext.
  std::string tls_ca_file;
  // Mutual TLS: this client's certificate chain and key (PEM files).
  std::string tls_cert_file;
  std::string tls_key_file;
  // Deadline of a call whose query has none (PlanQuery::deadline infinite).
  absl::Duration default_timeout = absl::Minutes(5);
};

// Thread-safe: calls may run concurrently.
class PlannerClient {
 public:
  virtual ~PlannerClient() = default;
  // The server's status codes and messages pass through unchanged (the
  // message prefixed with the server address), e.g. InvalidArgument naming
  // the field, Unauthenticated for a missing or wrong token, Unavailable when
  // the server cannot be reached. `query.cancelled` is not watched.
  virtual absl::StatusOr<PlanAnswer> Plan(const PlanQuery& query) = 0;
  virtual absl::StatusOr<EvaluateAnswer> Evaluate(
      const EvaluateQuery& query) = 0;
  // The new plan, the current plan on the new cluster (its plan JSON only
  // when feasible) and the migration cost; the deadline is
  // `query.plan.deadline`.
  virtual absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery& query) = 0;
};

// A client over one gRPC channel to `config.address`. InvalidArgument for
// an empty address or a TLS file without its pair, NotFound for a TLS file
// that cannot be read (naming the flag's file). Connecting is lazy: an
// unreachable server shows up as Unavailable on the first call.
absl::StatusOr<std::unique_ptr<PlannerClient>> MakeGrpcPlannerClient(
    const PlannerClientConfig& config);

// The prediction of a plan JSON as answers carry it (top-level fields,
// `breakdown`, per-stage `memory_gib`), for printing with the CLI's table.
// Per-stage memory comes back as its total (StageMemory::weights_gib holds
// it, the other parts 0): the answer carries only the total.
// InvalidArgument naming the field when a value is missing or not a number.
absl::StatusOr<Prediction> PredictionFromPlanJson(const nlohmann::json& plan);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CLIENT_PLANNER_CLIENT_H_
