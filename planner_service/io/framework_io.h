// The training framework (core/framework.h) in files, messages and output,
// and the training config as the arachne.v1.TrainingConfig message.
//
// In a file's `training` mapping (scenario files, measured-run files) the
// framework is a preset name or a mapping of the preset and overrides:
//
//   framework: megatron-deepspeed
//   framework: {preset: megatron-deepspeed, attention: flash,
//               micro_batch_fixed_ms: 2}
//
// The preset (default megatron-core) is applied first, then each override
// (SetFrameworkField names and text forms). In a message (plan files, job
// files, requests) it is arachne.v1.Framework: `preset` and one typed
// optional field per overridable field. Written out, a framework is its
// preset and the fields that differ from it (FrameworkOverrides), so a file
// read back gives the same FrameworkConfig.
#ifndef ARACHNE_PLANNER_SERVICE_IO_FRAMEWORK_IO_H_
#define ARACHNE_PLANNER_SERVICE_IO_FRAMEWORK_IO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "arachne/v1/planner.pb.h"
#include "planner_service/core/model/framework.h"
#include "planner_service/core/model/model.h"
#include "planner_service/io/json_yaml.h"

namespace arachne {

// The `framework` field of `training` (megatron-core when absent). Errors
// are InvalidArgument naming the field and the value, e.g. "<source>:
// training.framework.attention: must be flash, flash2 or materialized, got
// \"x\"",
// "<source>: training.framework: unknown field \"atention\" (fields: ...)".
absl::StatusOr<FrameworkConfig> ReadFramework(const ObjectReader& training);

// The message's preset, then each field present. Errors as ReadFramework's,
// under `path` (e.g. "training.framework") and `source` ("" for a request).
absl::StatusOr<FrameworkConfig> FrameworkFromMessage(
    const v1::Framework& message, absl::string_view source,
    absl::string_view path);
// The preset by name and the fields that differ from it.
v1::Framework FrameworkToMessage(const FrameworkConfig& framework);

// "megatron-deepspeed (attention=flash, micro_batch_fixed_ms=2)", or the
// preset name alone when nothing is overridden: for `arachne plan` output.
std::string FrameworkSummary(const FrameworkConfig& framework);

// A TrainingConfig message as the planner's type: 0 / "" / an absent
// framework take TrainingConfig's defaults. Errors name `path`'s field and
// the value ("<source>: training.seq_len: must be > 0 (or 0 for the
// default), got -1"; without a source, "training.seq_len: ..."). The
// service's requests (ResolveTraining), job files and plan files all read
// a training config through it.
absl::StatusOr<TrainingConfig> TrainingFromMessage(
    const v1::TrainingConfig& message, absl::string_view source,
    absl::string_view path);
// Every field, the framework as FrameworkToMessage writes it.
v1::TrainingConfig TrainingToMessage(const TrainingConfig& training);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_FRAMEWORK_IO_H_
