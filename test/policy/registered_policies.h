// The learned policy factory as a binary registers it at start-up
// (RegisterTorchPolicy over DefaultPoliciesDir), for tests of the default
// planner: registered on construction, removed on destruction, and
// re-registered over an empty policies directory on demand, which serves
// no model.
#ifndef ARACHNE_TEST_POLICY_REGISTERED_POLICIES_H_
#define ARACHNE_TEST_POLICY_REGISTERED_POLICIES_H_

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/policy/torch_policy.h"

namespace arachne::testing {

class RegisteredPolicies {
 public:
  RegisteredPolicies() {
    unsetenv("ARACHNE_POLICIES_DIR");
    RegisterTorchPolicy();
  }
  ~RegisteredPolicies() {
    RegisterLearnedPolicyFactory(nullptr);
    unsetenv("ARACHNE_POLICIES_DIR");
    if (!empty_dir_.empty()) std::filesystem::remove_all(empty_dir_);
  }
  RegisteredPolicies(const RegisteredPolicies&) = delete;
  RegisteredPolicies& operator=(const RegisteredPolicies&) = delete;

  // The factory reads the policies directory when registered
  // (DefaultPoliciesDir), so the directory is set first.
  void RegisterWithEmptyPoliciesDir() {
    empty_dir_ = std::filesystem::path(::testing::TempDir()) /
                 ("arachne_no_policies_" + std::to_string(getpid()));
    std::filesystem::remove_all(empty_dir_);
    std::filesystem::create_directories(empty_dir_);
    setenv("ARACHNE_POLICIES_DIR", empty_dir_.c_str(), 1);
    RegisterTorchPolicy();
  }

  // The empty directory (empty path before RegisterWithEmptyPoliciesDir).
  const std::filesystem::path& empty_dir() const { return empty_dir_; }

 private:
  std::filesystem::path empty_dir_;
};

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_POLICY_REGISTERED_POLICIES_H_
