#include "migration/transports.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#ifdef ARACHNE_HAVE_GLOO
#include "migration/gloo/gloo_transport.h"
#endif
#ifdef ARACHNE_HAVE_NCCL
#include "migration/nccl/nccl_transport.h"
#endif

namespace arachne::migration {

std::vector<std::string> TransportNames() {
  std::vector<std::string> names;
#ifdef ARACHNE_HAVE_NCCL
  names.push_back("nccl");
#endif
#ifdef ARACHNE_HAVE_GLOO
  names.push_back("gloo");
#endif
  return names;
}

absl::StatusOr<std::unique_ptr<TransportFactory>> MakeTransportFactory(
    absl::string_view name) {
#ifdef ARACHNE_HAVE_NCCL
  if (name == "nccl") return MakeNcclTransportFactory();
#endif
#ifdef ARACHNE_HAVE_GLOO
  if (name == "gloo") return MakeGlooTransportFactory();
#endif
  return absl::NotFoundError(
      absl::StrCat("unknown transport '", name, "'; built in: [",
                   absl::StrJoin(TransportNames(), ", "), "]"));
}

absl::StatusOr<std::unique_ptr<TransportFactory>>
MakeViableTransportFactory() {
  for (const std::string& name : TransportNames()) {
    auto f = MakeTransportFactory(name);
    if (f.ok() && (*f)->IsViable()) return f;
  }
  return absl::NotFoundError(absl::StrCat(
      "no viable transport among [", absl::StrJoin(TransportNames(), ", "),
      "]"));
}

}  // namespace arachne::migration
