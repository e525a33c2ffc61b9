#include "migration/core/rendezvous_store.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace arachne::migration {

std::string FileRendezvousStore::PathOf(absl::string_view key) const {
  std::string name;
  for (char c : key) {
    if (c == '/' || c == '%') {
      absl::StrAppend(&name, c == '/' ? "%2F" : "%25");
    } else {
      name.push_back(c);
    }
  }
  return absl::StrCat(dir_, "/", name);
}

absl::Status FileRendezvousStore::Set(absl::string_view key,
                                      absl::string_view value) {
  const std::string path = PathOf(key);
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!out) {
      return absl::UnavailableError(
          absl::StrCat("store: cannot write ", tmp, ": ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "store: cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileRendezvousStore::Get(absl::string_view key,
                                                     absl::Duration timeout) {
  const std::string path = PathOf(key);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::ostringstream buf;
      buf << in.rdbuf();
      return buf.str();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "store: key '", key, "' did not appear within ",
          absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

}  // namespace arachne::migration
