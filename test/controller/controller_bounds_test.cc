// Bounds on what callers send (issue 36, "Bounds everywhere";
// docs/errors.md, "Input bounds"): the helpers of
// planner_service/io/input_bounds.h and GetStatus's size budget as units,
// then every refused value end to end against a real arachne-controller
// process on 127.0.0.1 driven through its gRPC stub, each with its exact
// code and message and with nothing stored (GetStatus and the events
// after), and the agent's --node through the real arachne-agent binary.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "controller/controller.h"
#include "controller/controller_config.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/input_bounds.h"
#include "planner_service/io/json_yaml.h"
#include "test/controller/controller_harness.h"

namespace arachne::controller {
namespace {

using testing::ControllerProcess;
using testing::JobOptions;
using testing::JobYaml;
using testing::Settled;
using testing::StartAgent;
using testing::TempDir;
using testing::WaitFor;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr size_t kDefaultGrpcMessageLimit = size_t{4} << 20;

const char kCharsetRule[] =
    ": must be a node name of ASCII letters, digits, '-', '_' and '.', got ";
const char kLabelRule[] =
    ": must be a node name of '.'-separated labels of 1 to 63 characters, "
    "each starting and ending with a letter or digit, got ";

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// ---- the helpers -------------------------------------------------------

TEST(InputBounds, NodeNamesThatFollowTheRulePass) {
  for (const std::string& name :
       {std::string("a"), std::string("n0"), std::string("gpu-box-3"),
        std::string("Node_A"), std::string("n0.rack-1.example.com"),
        std::string(63, 'x'),
        // 253 bytes: four labels of 63 and one of 1, dots between.
        absl::StrCat(std::string(63, 'a'), ".", std::string(63, 'b'), ".",
                     std::string(63, 'c'), ".", std::string(61, 'd'))}) {
    EXPECT_TRUE(CheckNodeName("node", name).ok()) << name;
  }
}

TEST(InputBounds, NodeNamesThatBreakTheRuleAreRefusedWithABoundedQuote) {
  EXPECT_EQ(Message(CheckNodeName("node", "")),
            "node: must be a node name, got \"\"");
  const std::string big(10240, 'n');
  const absl::Status s = CheckNodeName("node", big);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s),
            absl::StrCat("node: must be a node name of at most 253 bytes, got "
                         "\"",
                         std::string(64, 'n'), "...\" (10240 bytes)"));
  EXPECT_FALSE(CheckNodeName("node", std::string(254, 'n')).ok());
  EXPECT_EQ(Message(CheckNodeName("node", "a/b")),
            absl::StrCat("node", kCharsetRule, "\"a/b\" (byte 0x2F at offset 1)"));
  EXPECT_EQ(Message(CheckNodeName("node", std::string("a\0b", 3))),
            absl::StrCat("node", kCharsetRule,
                         "\"a\\u0000b\" (byte 0x00 at offset 1)"));
  EXPECT_EQ(Message(CheckNodeName("nodes[2]", "a b")),
            absl::StrCat("nodes[2]", kCharsetRule,
                         "\"a b\" (byte 0x20 at offset 1)"));
  EXPECT_EQ(Message(CheckNodeName("node", "n\xc3\xa9")),
            absl::StrCat("node", kCharsetRule,
                         "\"n\xc3\xa9\" (byte 0xC3 at offset 1)"));
  for (const std::string& name :
       {std::string(".."), std::string("a..b"), std::string(".a"),
        std::string("a."), std::string("-a"), std::string("a-"),
        std::string("_a"), std::string("a.-b"), std::string(64, 'x')}) {
    EXPECT_EQ(Message(CheckNodeName("node", name)),
              absl::StrCat("node", kLabelRule, QuoteForMessage(name)))
        << name;
  }
}

TEST(InputBounds, Utf8IsCheckedNamingTheField) {
  EXPECT_TRUE(CheckUtf8("reason", "caf\xc3\xa9").ok());
  EXPECT_EQ(Message(CheckUtf8("reason", "ab\xff")),
            "reason: must be UTF-8 text, got byte 0xFF at offset 2 of 3 bytes");
  // An overlong form and a surrogate are not UTF-8 either.
  EXPECT_FALSE(CheckUtf8("reason", "\xc0\xaf").ok());
  EXPECT_FALSE(CheckUtf8("reason", "\xed\xa0\x80").ok());
}

TEST(InputBounds, FreeTextIsCutOnACharacterBoundaryWithAMarker) {
  EXPECT_EQ(TruncateText("short", 1024), "short");
  const std::string exact(1024, 'r');
  EXPECT_EQ(TruncateText(exact, 1024), exact);
  const std::string big(3500000, 'r');
  const std::string cut = TruncateText(big, 1024);
  EXPECT_LE(cut.size(), 1024u);
  EXPECT_THAT(cut, EndsWith("r [truncated: 3500000 bytes in all]"));
  EXPECT_THAT(cut, StartsWith(std::string(900, 'r')));
  // Two-byte characters: the cut never splits one.
  std::string accents;
  for (int i = 0; i < 2000; ++i) accents += "\xc3\xa9";
  for (size_t max : {size_t{100}, size_t{101}, size_t{1024}}) {
    const std::string c = TruncateText(accents, max);
    EXPECT_LE(c.size(), max);
    EXPECT_TRUE(CheckUtf8("text", c).ok()) << max;
    EXPECT_THAT(c, EndsWith(" [truncated: 4000 bytes in all]"));
  }
}

TEST(InputBounds, SecondsHaveAMaximum) {
  EXPECT_TRUE(CheckSeconds("within_s", 3600, 3600).ok());
  EXPECT_TRUE(CheckSeconds("within_s", 0.001, 3600).ok());
  EXPECT_EQ(Message(CheckSeconds("within_s", 1e308, 3600)),
            "within_s: must be seconds in (0, 3600], got 1e+308");
  EXPECT_EQ(Message(CheckSeconds("within_s", 3600.5, 3600)),
            "within_s: must be seconds in (0, 3600], got 3600.5");
  EXPECT_EQ(Message(CheckSeconds("deadline_s", 0, 86400)),
            "deadline_s: must be seconds in (0, 86400], got 0");
  EXPECT_EQ(Message(CheckSeconds("deadline_s", -1, 86400)),
            "deadline_s: must be seconds in (0, 86400], got -1");
  EXPECT_EQ(Message(CheckSeconds("deadline_s", std::nan(""), 86400)),
            "deadline_s: must be seconds in (0, 86400], got nan");
  EXPECT_EQ(Message(CheckSeconds("deadline_s", HUGE_VAL, 86400)),
            "deadline_s: must be seconds in (0, 86400], got inf");
}

// A length-delimited field on the wire: tag, one-byte length, bytes.
std::string Field(int number, const std::string& bytes) {
  return absl::StrCat(std::string(1, static_cast<char>(number << 3 | 2)),
                      std::string(1, static_cast<char>(bytes.size())), bytes);
}

TEST(InputBounds, RequestBytesNameTheFieldThatIsNotUtf8) {
  v1::HeartbeatRequest heartbeat;
  EXPECT_EQ(Message(ParseMessageBytes(Field(1, "\xff"), &heartbeat)),
            "node: must be UTF-8 text, got byte 0xFF at offset 0 of 1 bytes");
  v1::AnnounceJoinRequest announce;
  EXPECT_EQ(
      Message(ParseMessageBytes(Field(1, "a") + Field(1, "b\xc3"), &announce)),
      "nodes[1]: must be UTF-8 text, got byte 0xC3 at offset 1 of 2 bytes");
  // Nested messages are walked too (GetStatusResponse.members[0].node).
  v1::GetStatusResponse status;
  EXPECT_EQ(Message(ParseMessageBytes(Field(3, Field(1, "\x80")), &status)),
            "members[0].node: must be UTF-8 text, got byte 0x80 at offset 0 "
            "of 1 bytes");
  v1::RegisterRequest good;
  ASSERT_TRUE(ParseMessageBytes(Field(1, "a") + Field(2, "A6000"), &good).ok());
  EXPECT_EQ(good.node(), "a");
  EXPECT_EQ(good.gpu_type(), "A6000");
  EXPECT_EQ(Message(ParseMessageBytes("\x0a\x05" "ab", &heartbeat)),
            "request: not a valid arachne.v1.HeartbeatRequest (truncated or "
            "garbled bytes)");
}

TEST(StatusBudget, TheOldestDecisionsThenGenerationsAreLeftOut) {
  v1::GetStatusResponse status;
  for (int i = 0; i < 20; ++i) {
    v1::Decision* d = status.add_decisions();
    d->set_id(20 - i);  // the most recent first
    d->set_reason(std::string(300000, 'r'));
  }
  for (int i = 0; i < 20; ++i) {
    status.add_generations()->set_cluster(std::string(100000, 'c'));
  }
  ASSERT_GT(status.ByteSizeLong(), kDefaultGrpcMessageLimit);
  FitStatusBudget(&status, kStatusBudgetBytes);
  EXPECT_LE(status.ByteSizeLong(), kStatusBudgetBytes);
  // 20 x 300 KB of decisions and 2 MB of generations: 3 MiB keeps 3 of the
  // decisions (and every generation) or fewer decisions and generations.
  EXPECT_GT(status.decisions_omitted(), 0);
  EXPECT_EQ(status.decisions_size() + status.decisions_omitted(), 20);
  EXPECT_EQ(status.generations_size() + status.generations_omitted(), 20);
  ASSERT_GT(status.decisions_size(), 0);
  EXPECT_EQ(status.decisions(0).id(), 20);  // the most recent stays
  // Within the budget already: nothing is left out.
  v1::GetStatusResponse small;
  small.add_decisions()->set_reason("r");
  FitStatusBudget(&small, kStatusBudgetBytes);
  EXPECT_EQ(small.decisions_size(), 1);
  EXPECT_EQ(small.decisions_omitted(), 0);
}

// ---- end to end: a real arachne-controller -----------------------------

// A controller with no agents (min_gpus 1 is never reached), for refusals.
class BoundsE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    controller_ = std::make_unique<ControllerProcess>(dir_);
    ASSERT_TRUE(controller_->Start(JobYaml(JobOptions().MinGpus(1))).ok());
  }

  v1::Controller::Stub& stub() { return controller_->stub(); }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(10));
    return ctx;
  }

  grpc::Status Register(const std::string& node, double memory_gib = 0,
                        const std::string& gpu_type = "A6000",
                        const std::string& address = "127.0.0.1:1") {
    v1::RegisterRequest r;
    r.set_node(node);
    r.set_gpu_type(gpu_type);
    r.set_gpus(1);
    r.set_memory_gib(memory_gib);
    r.set_address(address);
    r.set_incarnation("i1");
    v1::RegisterResponse out;
    return stub().Register(Context().get(), r, &out);
  }
  grpc::Status Heartbeat(const std::string& node) {
    v1::HeartbeatRequest r;
    r.set_node(node);
    r.set_incarnation("i1");
    v1::HeartbeatResponse out;
    return stub().Heartbeat(Context().get(), r, &out);
  }
  grpc::Status Announce(const std::vector<std::string>& nodes,
                        double within_s) {
    v1::AnnounceJoinRequest r;
    for (const std::string& n : nodes) r.add_nodes(n);
    r.set_within_s(within_s);
    v1::AnnounceJoinResponse out;
    return stub().AnnounceJoin(Context().get(), r, &out);
  }
  grpc::Status Drain(const std::string& node, double deadline_s) {
    v1::DrainNodeRequest r;
    r.set_node(node);
    r.set_deadline_s(deadline_s);
    v1::DrainNodeResponse out;
    return stub().DrainNode(Context().get(), r, &out);
  }
  grpc::Status Replan(const std::string& reason) {
    v1::RequestReplanRequest r;
    r.set_reason(reason);
    v1::RequestReplanResponse out;
    return stub().RequestReplan(Context().get(), r, &out);
  }

  // The refusal is INVALID_ARGUMENT with exactly `message`.
  static void ExpectRefused(const grpc::Status& s, const std::string& message) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << s.error_message();
    EXPECT_EQ(s.error_message(), message);
  }

  // Nothing was stored: no member, no generation, no decision, and no
  // membership event (an announcement, a join, a drain).
  void ExpectNothingStored() {
    absl::StatusOr<v1::GetStatusResponse> st = controller_->Status();
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->members_size(), 0) << st->ShortDebugString();
    EXPECT_EQ(st->generation(), 0);
    EXPECT_EQ(st->decisions_size(), 0);
    EXPECT_EQ(st->error(), "");
    for (const v1::Event& e : controller_->Events()) {
      EXPECT_NE(e.kind(), "membership") << e.message();
      EXPECT_NE(e.kind(), "decision") << e.message();
    }
  }

  std::string dir_;
  std::unique_ptr<ControllerProcess> controller_;
};

TEST_F(BoundsE2E, AnnounceJoinWithinSHasAMaximum) {
  ExpectRefused(Announce({"n1"}, 1e308),
                "within_s: must be seconds in (0, 3600], got 1e+308");
  ExpectRefused(Announce({"n1"}, 3600.5),
                "within_s: must be seconds in (0, 3600], got 3600.5");
  ExpectRefused(Announce({"n1"}, std::nan("")),
                "within_s: must be seconds in (0, 3600], got nan");
  ExpectRefused(Announce({"n1"}, HUGE_VAL),
                "within_s: must be seconds in (0, 3600], got inf");
  ExpectRefused(Announce({"n1"}, 0),
                "within_s: must be seconds in (0, 3600], got 0");
  ExpectRefused(Announce({}, 10), "nodes: required, got none");
  ExpectRefused(
      Announce(std::vector<std::string>(4097, "n1"), 10),
      "nodes: must be at most 4096 node names, got 4097");
  ExpectNothingStored();
}

TEST_F(BoundsE2E, DrainNodeDeadlineHasAMaximum) {
  ExpectRefused(Drain("a", 1e308),
                "deadline_s: must be seconds in (0, 86400], got 1e+308");
  ExpectRefused(Drain("a", 86401),
                "deadline_s: must be seconds in (0, 86400], got 86401");
  ExpectRefused(Drain("a", std::nan("")),
                "deadline_s: must be seconds in (0, 86400], got nan");
  ExpectRefused(Drain("a", -1),
                "deadline_s: must be seconds in (0, 86400], got -1");
  // Within the bounds, the deadline passes and the node is looked up.
  grpc::Status s = Drain("a", 86400);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_EQ(s.error_message(), "node: \"a\" is not a member");
  ExpectNothingStored();
}

TEST_F(BoundsE2E, RegisterMemoryIsFinitePositiveAndAtMost1024GiB) {
  const std::string rule =
      "memory_gib: must be GiB per GPU in (0, 1024] (or 0 for the catalog's), "
      "got ";
  ExpectRefused(Register("a", std::nan("")), rule + "nan");
  ExpectRefused(Register("a", -5), rule + "-5");
  ExpectRefused(Register("a", 1e308), rule + "1e+308");
  ExpectRefused(Register("a", HUGE_VAL), rule + "inf");
  ExpectRefused(Register("a", 1024.5), rule + "1024.5");
  ExpectNothingStored();
}

TEST_F(BoundsE2E, NodeNamesFollowOneRuleAtEveryEntryPoint) {
  const std::string big(10240, 'n');
  const std::string big_quoted =
      absl::StrCat("\"", std::string(64, 'n'), "...\" (10240 bytes)");
  const std::string too_long =
      "must be a node name of at most 253 bytes, got " + big_quoted;
  // A 10 KB name never comes back whole: the message stays short.
  grpc::Status s = Register(big);
  ExpectRefused(s, "node: " + too_long);
  EXPECT_LT(s.error_message().size(), 200u);
  ExpectRefused(Heartbeat(big), "node: " + too_long);
  ExpectRefused(Drain(big, 10), "node: " + too_long);
  ExpectRefused(Announce({"n1", big}, 10), "nodes[1]: " + too_long);

  ExpectRefused(Register("a/b"),
                absl::StrCat("node", kCharsetRule,
                             "\"a/b\" (byte 0x2F at offset 1)"));
  ExpectRefused(Register(".."), absl::StrCat("node", kLabelRule, "\"..\""));
  ExpectRefused(Register(std::string("a\0b", 3)),
                absl::StrCat("node", kCharsetRule,
                             "\"a\\u0000b\" (byte 0x00 at offset 1)"));
  ExpectRefused(Heartbeat("a..b"),
                absl::StrCat("node", kLabelRule, "\"a..b\""));
  ExpectRefused(Heartbeat("../etc"),
                absl::StrCat("node", kCharsetRule,
                             "\"../etc\" (byte 0x2F at offset 2)"));
  ExpectRefused(Drain("a/b", 10),
                absl::StrCat("node", kCharsetRule,
                             "\"a/b\" (byte 0x2F at offset 1)"));
  ExpectRefused(Announce({"ok", std::string("x\0", 2)}, 10),
                absl::StrCat("nodes[1]", kCharsetRule,
                             "\"x\\u0000\" (byte 0x00 at offset 1)"));
  ExpectRefused(Heartbeat(""), "node: required, got none");
  // Other long values are quoted bounded too.
  s = Register("a", 0, std::string(10240, 'g'));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              StartsWith(absl::StrCat("gpu_type: unknown GPU type \"",
                                      std::string(64, 'g'),
                                      "...\" (10240 bytes)")));
  EXPECT_LT(s.error_message().size(), 2000u);
  ExpectRefused(Register("a", 0, "A6000", std::string(600, 'h')),
                absl::StrCat("address: must be host:port of at most 512 bytes, "
                             "got \"",
                             std::string(64, 'h'), "...\" (600 bytes)"));
  ExpectNothingStored();
}

TEST_F(BoundsE2E, StringsThatAreNotUtf8AreInvalidArgumentNamingTheField) {
  ExpectRefused(Heartbeat("\xff"),
                "node: must be UTF-8 text, got byte 0xFF at offset 0 of 1 "
                "bytes");
  ExpectRefused(Register("n\xc3"),
                "node: must be UTF-8 text, got byte 0xC3 at offset 1 of 2 "
                "bytes");
  ExpectRefused(Register("a", 0, "A6000\xfe"),
                "gpu_type: must be UTF-8 text, got byte 0xFE at offset 5 of 6 "
                "bytes");
  ExpectRefused(Announce({"ok", "b\xff"}, 10),
                "nodes[1]: must be UTF-8 text, got byte 0xFF at offset 1 of 2 "
                "bytes");
  ExpectRefused(Drain("\x80", 10),
                "node: must be UTF-8 text, got byte 0x80 at offset 0 of 1 "
                "bytes");
  ExpectRefused(Replan("why\xff"),
                "reason: must be UTF-8 text, got byte 0xFF at offset 3 of 4 "
                "bytes");
  ExpectNothingStored();
}

// RequestReplan reasons of 3.5 MB on a running job: each is cut to 1024
// bytes with its marker, and GetStatus stays far inside the 4 MB default
// after many maximal requests.
TEST(BoundsE2ERunning, HugeReplanReasonsAreCutAndGetStatusFitsTheDefaultLimit) {
  const std::string dir = TempDir("bounds-replan");
  ControllerProcess controller(dir);
  ASSERT_TRUE(
      controller.Start(JobYaml(JobOptions().MinGpus(1).Iterations(100000)))
          .ok());
  std::unique_ptr<agent::testing::AgentProcess> a =
      StartAgent("a", 1, dir, controller);
  absl::StatusOr<v1::GetStatusResponse> st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) {
        return s.generation() >= 1 && Settled(s);
      },
      absl::Seconds(40), "the first plan");
  ASSERT_TRUE(st.ok()) << st.status();

  auto replan = [&](const std::string& reason) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::RequestReplanRequest r;
    r.set_reason(reason);
    v1::RequestReplanResponse out;
    return controller.stub().RequestReplan(&ctx, r, &out);
  };
  const std::string huge(3500000, 'r');
  for (int i = 0; i < 3; ++i) {
    grpc::Status s = replan(huge);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::string cut = TruncateText(huge, kMaxReasonBytes);
  ASSERT_EQ(cut.size(), kMaxReasonBytes);
  st = WaitFor(
      controller,
      [&](const v1::GetStatusResponse& s) {
        for (const v1::Decision& d : s.decisions()) {
          if (absl::StrContains(d.trigger(), cut)) return true;
        }
        return false;
      },
      absl::Seconds(30), "a decision on the replan");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_LT(st->ByteSizeLong(), size_t{64} << 10);
  for (const v1::Decision& d : st->decisions()) {
    EXPECT_LE(d.trigger().size(), kMaxRecordTextBytes);
    EXPECT_THAT(d.trigger(), ::testing::Not(HasSubstr(std::string(2000, 'r'))));
  }

  // Many maximal requests, arriving faster than replans: their triggers
  // are cut too, and the response stays within its budget.
  std::string maximal(kMaxReasonBytes, 'm');
  for (int i = 0; i < 200; ++i) {
    grpc::Status s = replan(i % 2 == 0 ? maximal : huge);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  st = WaitFor(
      controller,
      [&](const v1::GetStatusResponse& s) {
        for (const v1::Decision& d : s.decisions()) {
          if (absl::StrContains(d.trigger(), std::string(900, 'm'))) {
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30), "a decision on the maximal replans");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_LE(st->ByteSizeLong(), kStatusBudgetBytes);
  EXPECT_LT(st->ByteSizeLong(), kDefaultGrpcMessageLimit);
  for (const v1::Decision& d : st->decisions()) {
    EXPECT_LE(d.trigger().size(), kMaxRecordTextBytes);
    EXPECT_LE(d.reason().size(), kMaxRecordTextBytes);
  }
  for (const v1::Event& e : controller.Events()) {
    EXPECT_LE(e.message().size(), 2 * kMaxRecordTextBytes + 64);
  }
  EXPECT_EQ(st->error(), "");
}

// The agent's --node follows the same rule: arachne-agent exits 2 naming it.
TEST(BoundsAgent, TheAgentsNodeFlagFollowsTheNodeNameRule) {
  auto run = [](const std::string& node, std::string* output) {
    // `timeout`: an agent that accepted the name would run on.
    const std::string command = absl::StrCat(
        "timeout 20 ", ARACHNE_BINARY_DIR,
        "/worker_agent/arachne-agent --node '", node,
        "' --gpu-type A6000 --virtual-gpus 1 --listen 127.0.0.1:0 "
        "--controller 127.0.0.1:1 2>&1");
    FILE* p = popen(command.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
    const int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::string out;
  EXPECT_EQ(run("a/b", &out), 2);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("arachne-agent: --node", kCharsetRule,
                                          "\"a/b\" (byte 0x2F at offset 1)\n")));
  out.clear();
  EXPECT_EQ(run("..", &out), 2);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("arachne-agent: --node", kLabelRule,
                                          "\"..\"\n")));
  out.clear();
  EXPECT_EQ(run(std::string(300, 'n'), &out), 2);
  EXPECT_THAT(out, HasSubstr(absl::StrCat(
                       "arachne-agent: --node: must be a node name of at most "
                       "253 bytes, got \"",
                       std::string(64, 'n'), "...\" (300 bytes)\n")));
}

// The keep-or-switch rule's fractions (decision.h) in a job file: in
// [0, 1], else an error naming the field and the value.
TEST(JobBounds, SwitchMinGainAndUnmeasuredTypeMarginAreFractions) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  absl::StatusOr<std::vector<ModelSpec>> models = LoadModelCatalog();
  ASSERT_TRUE(catalog.ok() && models.ok());
  v1::JobSpec spec;
  spec.mutable_model()->set_name("tiny-gpt");
  spec.set_iterations(10);
  absl::StatusOr<JobSettings> j = ResolveJob(spec, "job.yaml", *catalog, *models);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_DOUBLE_EQ(j->switch_min_gain, 0.05);
  EXPECT_DOUBLE_EQ(j->unmeasured_type_margin, 0.1);
  spec.set_switch_min_gain(0);
  spec.set_unmeasured_type_margin(1);
  j = ResolveJob(spec, "job.yaml", *catalog, *models);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_DOUBLE_EQ(j->switch_min_gain, 0);
  EXPECT_DOUBLE_EQ(j->unmeasured_type_margin, 1);
  spec.set_switch_min_gain(1.5);
  EXPECT_EQ(ResolveJob(spec, "job.yaml", *catalog, *models).status().message(),
            "job.yaml: switch_min_gain: must be in [0, 1], got 1.5");
  spec.set_switch_min_gain(0.05);
  spec.set_unmeasured_type_margin(std::nan(""));
  EXPECT_EQ(ResolveJob(spec, "job.yaml", *catalog, *models).status().message(),
            "job.yaml: unmeasured_type_margin: must be in [0, 1], got nan");
}

// replan_correction_factor: 2 by default, 0 (never) or a factor in
// [1.05, 10000], else an error naming the field and the value.
TEST(JobBounds, ReplanCorrectionFactorIsZeroOrAFactor) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  absl::StatusOr<std::vector<ModelSpec>> models = LoadModelCatalog();
  ASSERT_TRUE(catalog.ok() && models.ok());
  v1::JobSpec spec;
  spec.mutable_model()->set_name("tiny-gpt");
  spec.set_iterations(10);
  absl::StatusOr<JobSettings> j = ResolveJob(spec, "job.yaml", *catalog, *models);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_DOUBLE_EQ(j->replan_correction_factor, 2);
  for (double ok : {0.0, 1.05, 10000.0}) {
    spec.set_replan_correction_factor(ok);
    j = ResolveJob(spec, "job.yaml", *catalog, *models);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_DOUBLE_EQ(j->replan_correction_factor, ok);
  }
  spec.set_replan_correction_factor(1);
  EXPECT_EQ(ResolveJob(spec, "job.yaml", *catalog, *models).status().message(),
            "job.yaml: replan_correction_factor: must be 0 (never) or in "
            "[1.05, 10000], got 1");
  spec.set_replan_correction_factor(-2);
  EXPECT_EQ(ResolveJob(spec, "job.yaml", *catalog, *models).status().message(),
            "job.yaml: replan_correction_factor: must be 0 (never) or in "
            "[1.05, 10000], got -2");
  spec.set_replan_correction_factor(std::nan(""));
  EXPECT_EQ(ResolveJob(spec, "job.yaml", *catalog, *models).status().message(),
            "job.yaml: replan_correction_factor: must be 0 (never) or in "
            "[1.05, 10000], got nan");
}

}  // namespace
}  // namespace arachne::controller
