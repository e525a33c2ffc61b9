#include "worker_agent/agent_proto_convert.h"

#include <cmath>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/framework_io.h"
#include "planner_service/io/message_json.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/plan_io.h"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/api/proto_convert.h"

namespace arachne::agent {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

absl::Status Missing(absl::string_view field) {
  return FieldError(field, "required, got none");
}

// `lost` GPUs, each a GPU of `old_cluster`.
absl::StatusOr<std::vector<migration::GpuId>> LostFromProto(
    const google::protobuf::RepeatedPtrField<v1::GpuRef>& lost,
    const Cluster& old_cluster) {
  absl::flat_hash_map<std::string, int> gpus_of;
  for (const Node& n : old_cluster.nodes()) gpus_of[n.name] = n.num_gpus;
  std::vector<migration::GpuId> out;
  for (int i = 0; i < lost.size(); ++i) {
    const v1::GpuRef& g = lost[i];
    const std::string at = absl::StrCat("lost[", i, "]");
    auto it = gpus_of.find(g.node());
    if (it == gpus_of.end()) {
      return FieldError(
          absl::StrCat(at, ".node"),
          absl::StrCat("unknown node \"", g.node(), "\" (not in old_cluster)"));
    }
    if (g.index() < 0 || g.index() >= it->second) {
      return FieldError(
          absl::StrCat(at, ".index"),
          absl::StrCat("must be in 0..", it->second - 1, " (node \"", g.node(),
                       "\" has ", it->second, " GPUs), got ", g.index()));
    }
    out.push_back({g.node(), g.index()});
  }
  return out;
}

v1::Model ModelSpecToProto(const ModelSpec& model) {
  v1::Model out;
  // The catalog-entry tree and the message are one schema; a failure is a
  // bug here.
  absl::Status s = MessageFromJson(ModelToJson(model), "", "", &out);
  CHECK(s.ok()) << s;
  return out;
}

v1::GpuRef GpuRefToProto(const migration::GpuId& gpu) {
  v1::GpuRef out;
  out.set_node(gpu.node);
  out.set_index(gpu.index);
  return out;
}

void TimingToProto(const PhaseTiming& t, v1::PhaseTiming* out) {
  out->set_seconds(t.seconds);
  out->set_bytes_sent(t.bytes_sent);
  out->set_bytes_received(t.bytes_received);
}

PhaseTiming TimingFromProto(const v1::PhaseTiming& t) {
  return {t.seconds(), t.bytes_sent(), t.bytes_received()};
}

}  // namespace

absl::Status CheckGeneration(int64_t generation) {
  if (generation >= 1) return absl::OkStatus();
  return FieldError("generation",
                    absl::StrCat("must be an integer >= 1, got ", generation));
}

absl::StatusOr<absl::Duration> PhaseTimeoutFromProto(double timeout_s,
                                                     absl::string_view field) {
  if (!std::isfinite(timeout_s) || timeout_s < 0) {
    return FieldError(field,
                      absl::StrCat("must be >= 0 seconds (0 = ",
                                   absl::FormatDuration(kDefaultPhaseTimeout),
                                   "), got ", timeout_s));
  }
  if (timeout_s == 0) return kDefaultPhaseTimeout;
  return absl::Seconds(timeout_s);
}

EngineConfig EngineConfigFromProto(const v1::EngineConfig& e) {
  EngineConfig out;
  if (e.has_learning_rate()) out.learning_rate = e.learning_rate();
  if (e.has_warmup_iterations()) out.warmup_iterations = e.warmup_iterations();
  if (e.has_adam_beta1()) out.adam_beta1 = e.adam_beta1();
  if (e.has_adam_beta2()) out.adam_beta2 = e.adam_beta2();
  if (e.has_adam_eps()) out.adam_eps = e.adam_eps();
  if (e.has_weight_decay()) out.weight_decay = e.weight_decay();
  if (e.has_data_seed()) out.data_seed = e.data_seed();
  if (e.has_init_seed()) out.init_seed = e.init_seed();
  if (e.has_token_file()) {
    out.token_file = EngineConfig::TokenFile{e.token_file().path(),
                                             e.token_file().token_bytes()};
  }
  if (e.has_lr_schedule()) out.lr_schedule = e.lr_schedule();
  if (e.has_decay_iterations()) out.decay_iterations = e.decay_iterations();
  if (e.has_min_learning_rate()) out.min_learning_rate = e.min_learning_rate();
  if (e.has_grad_clip_norm()) out.grad_clip_norm = e.grad_clip_norm();
  return out;
}

v1::EngineConfig EngineConfigToProto(const EngineConfig& e) {
  v1::EngineConfig out;
  out.set_learning_rate(e.learning_rate);
  out.set_warmup_iterations(e.warmup_iterations);
  out.set_adam_beta1(e.adam_beta1);
  out.set_adam_beta2(e.adam_beta2);
  out.set_adam_eps(e.adam_eps);
  out.set_weight_decay(e.weight_decay);
  out.set_data_seed(e.data_seed);
  out.set_init_seed(e.init_seed);
  if (e.token_file.has_value()) {
    out.mutable_token_file()->set_path(e.token_file->path);
    out.mutable_token_file()->set_token_bytes(e.token_file->token_bytes);
  }
  out.set_lr_schedule(e.lr_schedule);
  out.set_decay_iterations(e.decay_iterations);
  out.set_min_learning_rate(e.min_learning_rate);
  out.set_grad_clip_norm(e.grad_clip_norm);
  return out;
}

absl::StatusOr<JobSpec> JobSpecFromProto(const v1::ModelRef& model,
                                         const v1::Model* model_spec,
                                         const v1::TrainingConfig& training,
                                         const v1::EngineConfig& engine,
                                         const std::vector<ModelSpec>& models) {
  JobSpec job;
  const bool has_ref =
      !model.name().empty() || !model.hf_config_json().empty();
  if (has_ref && model_spec != nullptr) {
    return FieldError("model_spec",
                      "give either model or model_spec, not both");
  }
  if (model_spec != nullptr) {
    absl::StatusOr<ModelSpec> m = ModelFromMessage(*model_spec, "", "model_spec");
    if (!m.ok()) return m.status();
    job.model = *std::move(m);
  } else if (has_ref) {
    absl::StatusOr<ModelSpec> m = ResolveModelRef(ModelRefFromProto(model), models);
    if (!m.ok()) return m.status();
    job.model = *std::move(m);
  } else {
    return FieldError("model",
                      "required (model.name, model.hf_config_json or "
                      "model_spec), got none");
  }
  absl::StatusOr<TrainingConfig> resolved =
      ResolveTraining(TrainingFromProto(training));
  if (!resolved.ok()) return resolved.status();
  job.training = *resolved;
  job.engine = EngineConfigFromProto(engine);
  return job;
}

void PlanLayoutToProto(const migration::PlanLayout& layout,
                       v1::StateLayout* out) {
  out->Clear();
  out->mutable_ranks()->Reserve(layout.num_gpus());
  for (int g = 0; g < layout.num_gpus(); ++g) {
    v1::RankLayout* rank = out->add_ranks();
    *rank->mutable_gpu() = GpuRefToProto(layout.gpus()[g]);
    const migration::GpuRole& role = layout.role(g);
    rank->set_template_index(role.template_index);
    rank->set_replica(role.replica);
    rank->set_stage(role.stage);
    rank->set_tp_rank(role.tp_rank);
    const std::vector<migration::Holding>& holdings = layout.holdings(g);
    rank->mutable_holdings()->Reserve(static_cast<int>(holdings.size()));
    for (const migration::Holding& h : holdings) {
      v1::LayoutHolding* out_h = rank->add_holdings();
      out_h->set_tensor(h.tensor);
      out_h->set_begin(h.range.begin);
      out_h->set_end(h.range.end);
    }
  }
}

void RankMigrationToProto(const migration::StateDiff& diff,
                          const migration::MigrationSchedule& schedule,
                          int rank, v1::RankMigration* out) {
  CHECK_GE(rank, 0);
  CHECK_LT(rank, static_cast<int>(diff.required.size()));
  out->Clear();
  out->set_rank(rank);
  out->set_world_size(static_cast<int>(diff.required.size()));
  for (const migration::Holding& h : diff.kept[rank]) {
    v1::MigrationSegment* s = out->add_kept();
    s->set_tensor(h.tensor);
    s->set_begin(h.range.begin);
    s->set_end(h.range.end);
  }
  for (int stage : {1, 2}) {
    const std::vector<migration::Round>& rounds = schedule.stage(stage);
    auto* transfers = stage == 1 ? out->mutable_stage1() : out->mutable_stage2();
    for (size_t r = 0; r < rounds.size(); ++r) {
      for (const migration::Transfer& t : rounds[r].transfers) {
        if (t.sender != rank && t.receiver != rank) continue;
        // A rank never sends to itself (kept bytes are copied locally), so
        // each transfer is one end's send or the other's receive.
        CHECK_NE(t.sender, t.receiver);
        v1::MigrationTransfer* m = transfers->Add();
        m->set_round(static_cast<int>(r));
        m->set_send(t.sender == rank);
        m->set_peer(t.sender == rank ? t.receiver : t.sender);
        for (const migration::TransferSegment& seg : t.segments) {
          v1::MigrationSegment* s = m->add_segments();
          s->set_tensor(seg.tensor);
          s->set_begin(seg.range.begin);
          s->set_end(seg.range.end);
        }
      }
    }
  }
  out->set_stage1_rounds(static_cast<int>(schedule.stage1.size()));
  out->set_stage2_rounds(static_cast<int>(schedule.stage2.size()));
}

absl::StatusOr<PrepareArgs> PrepareArgsFromProto(
    const v1::PrepareRequest& request, const GpuCatalog& catalog,
    const std::vector<ModelSpec>& models) {
  PrepareArgs args;
  if (absl::Status s = CheckGeneration(request.generation()); !s.ok()) {
    return s;
  }
  args.generation = request.generation();

  absl::StatusOr<JobSpec> job =
      JobSpecFromProto(request.model(), request.has_model_spec()
                                            ? &request.model_spec()
                                            : nullptr,
                       request.training(), request.engine(), models);
  if (!job.ok()) return job.status();
  args.job = *std::move(job);

  if (!request.has_cluster()) return Missing("cluster");
  absl::StatusOr<Cluster> cluster =
      ClusterFromMessage(request.cluster(), catalog, "", "cluster");
  if (!cluster.ok()) return cluster.status();
  args.cluster = *std::move(cluster);
  if (!request.has_plan()) return Missing("plan");
  absl::StatusOr<Plan> plan = PlanFromMessage(
      request.plan().templates(), args.cluster, catalog, "", "plan");
  if (!plan.ok()) return plan.status();
  args.plan = *std::move(plan);

  if (request.has_old_plan() != request.has_old_cluster()) {
    return request.has_old_plan()
               ? FieldError("old_cluster", "required with old_plan, got none")
               : FieldError("old_plan", "required with old_cluster, got none");
  }
  if (request.has_old_plan()) {
    absl::StatusOr<Cluster> old_cluster =
        ClusterFromMessage(request.old_cluster(), catalog, "", "old_cluster");
    if (!old_cluster.ok()) return old_cluster.status();
    absl::StatusOr<Plan> old_plan = PlanFromMessage(
        request.old_plan().templates(), *old_cluster, catalog, "", "old_plan");
    if (!old_plan.ok()) return old_plan.status();
    absl::StatusOr<std::vector<migration::GpuId>> lost =
        LostFromProto(request.lost(), *old_cluster);
    if (!lost.ok()) return lost.status();
    args.old_cluster = *std::move(old_cluster);
    args.old_plan = *std::move(old_plan);
    args.lost = *std::move(lost);
  } else if (!request.lost().empty()) {
    return FieldError("lost", absl::StrCat("only with old_plan (lost GPUs are "
                                           "GPUs of the old plan), got ",
                                           request.lost_size()));
  }
  args.store_address = request.store_address();
  args.checkpoint_dir = request.checkpoint_dir();
  return args;
}

JobMessages JobSpecToProto(const JobSpec& job) {
  return JobMessages{.model_spec = ModelSpecToProto(job.model),
                     .training = TrainingToMessage(job.training),
                     .engine = EngineConfigToProto(job.engine)};
}

void ModelStateToProto(
    const migration::ModelState& state,
    google::protobuf::RepeatedPtrField<v1::TensorDescription>* tensors) {
  for (const migration::TensorSpec& t : state.tensors()) {
    v1::TensorDescription* d = tensors->Add();
    d->set_name(t.name);
    d->set_kind(std::string(migration::StateKindName(t.kind)));
    d->set_bytes_per_element(migration::BytesPerElement(t.kind));
    d->set_layer(t.layer);
    d->set_expert(t.expert);
    for (int64_t dim : t.shape) d->add_shape(dim);
    d->set_tp_split(std::string(migration::TpSplitName(t.split)));
  }
}

absl::StatusOr<migration::ModelState> ModelStateFromProto(
    const ModelSpec& model,
    const google::protobuf::RepeatedPtrField<v1::TensorDescription>& tensors) {
  std::vector<migration::TensorSpec> specs;
  specs.reserve(tensors.size());
  for (int i = 0; i < tensors.size(); ++i) {
    const v1::TensorDescription& d = tensors[i];
    const std::string at = absl::StrCat("tensors[", i, "]");
    migration::TensorSpec t;
    t.name = d.name();
    absl::StatusOr<migration::StateKind> kind =
        migration::StateKindFromName(d.kind(), at + ".kind");
    if (!kind.ok()) return kind.status();
    t.kind = *kind;
    // The canonical layout fixes each kind's element size; an engine that
    // stores another cannot exchange bytes with this one.
    if (d.bytes_per_element() != migration::BytesPerElement(t.kind)) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".bytes_per_element: ", d.kind(), " is ",
          migration::BytesPerElement(t.kind), " bytes per element, got ",
          d.bytes_per_element()));
    }
    t.layer = d.layer();
    t.expert = d.expert();
    t.shape.assign(d.shape().begin(), d.shape().end());
    absl::StatusOr<migration::TpSplit> split =
        migration::TpSplitFromName(d.tp_split(), at + ".tp_split");
    if (!split.ok()) return split.status();
    t.split = *split;
    specs.push_back(std::move(t));
  }
  return migration::ModelState::FromTensors(model, std::move(specs));
}

v1::PrepareRequest PrepareRequestFromArgs(const PrepareArgs& args,
                                          const GpuCatalog& catalog) {
  v1::PrepareRequest r;
  r.set_generation(args.generation);
  SetJob(args.job, &r);
  // Plans are written as plan files are (templates of a PlanDocument); the
  // prediction is not part of a switch.
  const auto templates_of = [&](const Plan& plan, const Cluster& cluster) {
    return PlanToDocument(plan, Prediction{}, cluster, catalog, args.job.model,
                          args.job.training)
        .templates();
  };
  *r.mutable_cluster() = ClusterToMessage(args.cluster, catalog);
  *r.mutable_plan()->mutable_templates() =
      templates_of(args.plan, args.cluster);
  if (args.old_plan.has_value() && args.old_cluster.has_value()) {
    *r.mutable_old_cluster() = ClusterToMessage(*args.old_cluster, catalog);
    *r.mutable_old_plan()->mutable_templates() =
        templates_of(*args.old_plan, *args.old_cluster);
  }
  for (const migration::GpuId& g : args.lost) {
    *r.add_lost() = GpuRefToProto(g);
  }
  r.set_store_address(args.store_address);
  r.set_checkpoint_dir(args.checkpoint_dir);
  return r;
}

v1::PrepareResponse PrepareResultToProto(const PrepareResult& result) {
  v1::PrepareResponse out;
  out.set_bytes_to_receive(result.bytes_to_receive);
  out.set_bytes_to_send(result.bytes_to_send);
  out.set_bytes_kept(result.bytes_kept);
  out.set_estimated_seconds(result.estimated_seconds);
  return out;
}

PrepareResult PrepareResultFromProto(const v1::PrepareResponse& r) {
  return {r.bytes_to_receive(), r.bytes_to_send(), r.bytes_kept(),
          r.estimated_seconds()};
}

v1::Phase PhaseToProto(Phase phase) {
  switch (phase) {
    case Phase::kIdle:
      return v1::PHASE_IDLE;
    case Phase::kPrepared:
      return v1::PHASE_PREPARED;
    case Phase::kPaused:
      return v1::PHASE_PAUSED;
    case Phase::kMigrated1:
      return v1::PHASE_MIGRATED1;
    case Phase::kMigrated2:
      return v1::PHASE_MIGRATED2;
    case Phase::kRebuilt:
      return v1::PHASE_REBUILT;
    case Phase::kRunning:
      return v1::PHASE_RUNNING;
    case Phase::kStopped:
      return v1::PHASE_STOPPED;
    case Phase::kFailed:
      return v1::PHASE_FAILED;
  }
  LOG(FATAL) << "unknown Phase " << static_cast<int>(phase);
}

absl::StatusOr<Phase> PhaseFromProto(v1::Phase phase) {
  switch (phase) {
    case v1::PHASE_IDLE:
      return Phase::kIdle;
    case v1::PHASE_PREPARED:
      return Phase::kPrepared;
    case v1::PHASE_PAUSED:
      return Phase::kPaused;
    case v1::PHASE_MIGRATED1:
      return Phase::kMigrated1;
    case v1::PHASE_MIGRATED2:
      return Phase::kMigrated2;
    case v1::PHASE_REBUILT:
      return Phase::kRebuilt;
    case v1::PHASE_RUNNING:
      return Phase::kRunning;
    case v1::PHASE_STOPPED:
      return Phase::kStopped;
    case v1::PHASE_FAILED:
      return Phase::kFailed;
    default:
      break;
  }
  return FieldError("phase",
                    absl::StrCat("unknown phase ", static_cast<int>(phase)));
}

v1::StatusResponse NodeStatusToProto(const NodeStatus& s, const NodeGpus& gpus,
                                     const GpuCatalog& catalog) {
  v1::StatusResponse out;
  out.set_current_generation(s.current_generation);
  out.set_prepared_generation(s.prepared_generation);
  out.set_phase(PhaseToProto(s.phase));
  out.set_iteration(s.iteration);
  out.set_loss(s.loss);
  for (const RankStatus& r : s.ranks) {
    v1::RankStatus* o = out.add_ranks();
    *o->mutable_gpu() = GpuRefToProto(r.gpu);
    o->set_in_plan(r.in_plan);
    o->set_iteration(r.iteration);
    o->set_loss(r.loss);
    o->set_iteration_seconds(r.iteration_seconds);
    o->set_tokens_per_second(r.tokens_per_second);
    o->set_state_bytes(r.state_bytes);
    o->set_peak_rss_bytes(r.peak_rss_bytes);
    o->set_error(r.error);
    o->set_lost(r.lost);
    o->set_engine_pid(r.engine_pid);
    o->set_device(r.device);
    o->set_switch_start_rss_bytes(r.switch_start_rss_bytes);
    o->set_switch_peak_rss_bytes(r.switch_peak_rss_bytes);
  }
  TimingToProto(s.pause, out.mutable_pause());
  TimingToProto(s.stage1, out.mutable_stage1());
  TimingToProto(s.stage2, out.mutable_stage2());
  TimingToProto(s.rebuild_groups, out.mutable_rebuild_groups());
  TimingToProto(s.rebuild_engines, out.mutable_rebuild_engines());
  TimingToProto(s.resume, out.mutable_resume());
  out.set_node(gpus.node);
  if (gpus.gpu_type >= 0 && gpus.gpu_type < catalog.size()) {
    out.set_gpu_type(catalog.type(gpus.gpu_type).id);
  }
  out.set_gpus(gpus.count);
  out.set_virtual_gpus(gpus.virtual_gpus);
  return out;
}

absl::StatusOr<NodeStatus> NodeStatusFromProto(const v1::StatusResponse& r) {
  NodeStatus s;
  s.current_generation = r.current_generation();
  s.prepared_generation = r.prepared_generation();
  absl::StatusOr<Phase> phase = PhaseFromProto(r.phase());
  if (!phase.ok()) return phase.status();
  s.phase = *phase;
  s.iteration = r.iteration();
  s.loss = r.loss();
  for (const v1::RankStatus& o : r.ranks()) {
    RankStatus rank;
    rank.gpu = {o.gpu().node(), o.gpu().index()};
    rank.in_plan = o.in_plan();
    rank.iteration = o.iteration();
    rank.loss = o.loss();
    rank.iteration_seconds = o.iteration_seconds();
    rank.tokens_per_second = o.tokens_per_second();
    rank.state_bytes = o.state_bytes();
    rank.peak_rss_bytes = o.peak_rss_bytes();
    rank.error = o.error();
    rank.lost = o.lost();
    rank.engine_pid = o.engine_pid();
    rank.device = o.device();
    rank.switch_start_rss_bytes = o.switch_start_rss_bytes();
    rank.switch_peak_rss_bytes = o.switch_peak_rss_bytes();
    s.ranks.push_back(std::move(rank));
  }
  s.pause = TimingFromProto(r.pause());
  s.stage1 = TimingFromProto(r.stage1());
  s.stage2 = TimingFromProto(r.stage2());
  s.rebuild_groups = TimingFromProto(r.rebuild_groups());
  s.rebuild_engines = TimingFromProto(r.rebuild_engines());
  s.resume = TimingFromProto(r.resume());
  return s;
}

}  // namespace arachne::agent
