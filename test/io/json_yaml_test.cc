#include "planner_service/io/json_yaml.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

TEST(ParseJsonOrYamlTest, YamlScalarsKeepTheirTypes) {
  absl::StatusOr<Json> j = ParseJsonOrYaml(
      "i: 4\n"
      "neg: -2\n"
      "f: 1.5\n"
      "e: 1e3\n"
      "hex: 0x10\n"
      "t: true\n"
      "F: False\n"
      "s: hello world\n"
      "qi: \"4\"\n"
      "qf: '1.0'\n"
      "word: yes\n"
      "n: ~\n"
      "empty:\n"
      "list: [1, two, 3.0]\n"
      "nested: {a: 1}\n",
      "t.yaml");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_TRUE((*j)["i"].is_number_integer());
  EXPECT_EQ((*j)["i"].get<int>(), 4);
  EXPECT_EQ((*j)["neg"].get<int>(), -2);
  EXPECT_TRUE((*j)["f"].is_number_float());
  EXPECT_DOUBLE_EQ((*j)["f"].get<double>(), 1.5);
  EXPECT_TRUE((*j)["e"].is_number_float());
  EXPECT_DOUBLE_EQ((*j)["e"].get<double>(), 1000.0);
  EXPECT_EQ((*j)["hex"].get<int>(), 16);
  EXPECT_EQ((*j)["t"], Json(true));
  EXPECT_EQ((*j)["F"], Json(false));
  EXPECT_EQ((*j)["s"], Json("hello world"));
  EXPECT_EQ((*j)["qi"], Json("4"));      // quoted: a string
  EXPECT_EQ((*j)["qf"], Json("1.0"));    // quoted: a string
  EXPECT_EQ((*j)["word"], Json("yes"));  // YAML 1.2: not a bool
  EXPECT_TRUE((*j)["n"].is_null());
  EXPECT_TRUE((*j)["empty"].is_null());
  EXPECT_EQ((*j)["list"], Json::parse(R"([1, "two", 3.0])"));
  EXPECT_TRUE((*j)["list"][2].is_number_float());
  EXPECT_EQ((*j)["nested"]["a"].get<int>(), 1);
}

TEST(ParseJsonOrYamlTest, JsonAndYamlGiveTheSameTree) {
  absl::StatusOr<Json> a = ParseJsonOrYaml(
      R"({"nodes": [{"name": "n0", "gpu": "A100", "gpus": 4}], "bw": 1.5})",
      "a.json");
  absl::StatusOr<Json> b = ParseJsonOrYaml(
      "nodes:\n  - name: n0\n    gpu: A100\n    gpus: 4\nbw: 1.5\n", "b.yaml");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, *b);
}

TEST(ParseJsonOrYamlTest, YamlFlowMappingStartingWithBraceParses) {
  absl::StatusOr<Json> j = ParseJsonOrYaml("{gpu: A100, gpus: 4}", "f.yaml");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["gpus"].get<int>(), 4);
}

TEST(ParseJsonOrYamlTest, MalformedJsonNamesSourceLineAndColumn) {
  absl::StatusOr<Json> j =
      ParseJsonOrYaml("{\n  \"a\": 1,\n  \"b\": ]\n}", "plan.json");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()), HasSubstr("plan.json:3:"));
  EXPECT_THAT(std::string(j.status().message()), HasSubstr("invalid JSON"));
}

TEST(ParseJsonOrYamlTest, MalformedYamlNamesSourceLineAndColumn) {
  absl::StatusOr<Json> j =
      ParseJsonOrYaml("nodes:\n  - name: a\n    gpus: [1, 2\n", "c.yaml");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()), HasSubstr("c.yaml:"));
  EXPECT_THAT(std::string(j.status().message()), HasSubstr("invalid YAML"));
}

TEST(ParseJsonOrYamlTest, DuplicateKeysAreErrors) {
  absl::StatusOr<Json> y = ParseJsonOrYaml("a: 1\nb: 2\na: 3\n", "d.yaml");
  ASSERT_FALSE(y.ok());
  EXPECT_THAT(std::string(y.status().message()),
              HasSubstr("d.yaml:3:1: duplicate key \"a\""));
  absl::StatusOr<Json> j = ParseJsonOrYaml(R"({"a": 1, "a": 2})", "d.json");
  ASSERT_FALSE(j.ok());
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("d.json: duplicate key \"a\""));
}

TEST(ParseJsonOrYamlTest, EmptyTextIsNull) {
  absl::StatusOr<Json> j = ParseJsonOrYaml("# only a comment\n", "e.yaml");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_TRUE(j->is_null());
}

class ObjectReaderTest : public ::testing::Test {
 protected:
  ObjectReader Reader(const char* yaml) {
    tree_ = *ParseJsonOrYaml(yaml, "cluster.yaml");
    return *ObjectReader::Create(tree_, "cluster.yaml", "node_groups[1]");
  }
  Json tree_;
};

TEST_F(ObjectReaderTest, IntRangeErrorNamesPathAndValue) {
  ObjectReader r = Reader("count: -2\n");
  absl::StatusOr<int> v = r.Int("count", 1);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      std::string(v.status().message()),
      "cluster.yaml: node_groups[1].count: must be an integer > 0, got -2");
}

TEST_F(ObjectReaderTest, IntRejectsFloatsStringsAndTooLarge) {
  ObjectReader r = Reader("a: 2.5\nb: four\nc: 3000000000\nd: 7\n");
  EXPECT_EQ(std::string(r.Int("a", 0).status().message()),
            "cluster.yaml: node_groups[1].a: must be an integer >= 0, got 2.5");
  EXPECT_EQ(std::string(r.Int("b").status().message()),
            "cluster.yaml: node_groups[1].b: must be an integer, got \"four\"");
  EXPECT_THAT(std::string(r.Int("c", 1).status().message()),
              HasSubstr("must be an integer <= 2147483647, got 3000000000"));
  EXPECT_THAT(std::string(r.Int("d", 1, 4).status().message()),
              HasSubstr("must be an integer <= 4, got 7"));
  EXPECT_EQ(*r.Int64("c", 1), 3000000000);
}

TEST_F(ObjectReaderTest, UnknownFieldIsAnError) {
  ObjectReader r = Reader("gpu_typ: A100\ncount: 2\n");
  absl::Status s = r.AllowOnly({"gpu", "count"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()),
            "cluster.yaml: node_groups[1]: unknown field \"gpu_typ\" "
            "(allowed: gpu, count)");
}

TEST_F(ObjectReaderTest, MissingRequiredFieldNamesIt) {
  ObjectReader r = Reader("gpu: A100\ncount:\n");
  absl::StatusOr<int> v = r.Int("count", 1);
  EXPECT_EQ(std::string(v.status().message()),
            "cluster.yaml: node_groups[1]: missing required field \"count\"");
  EXPECT_EQ(std::string(r.String("name").status().message()),
            "cluster.yaml: node_groups[1]: missing required field \"name\"");
}

TEST_F(ObjectReaderTest, TypedReadersAndDefaults) {
  ObjectReader r = Reader(
      "s: x\nn: 3\nbw: 12.5\nb: true\nlist: [a, b]\nbad_list: [a, 1]\n"
      "zero: 0\nobj: {k: 1}\n");
  EXPECT_EQ(*r.String("s"), "x");
  EXPECT_DOUBLE_EQ(*r.Number("n", 0, true), 3.0);
  EXPECT_DOUBLE_EQ(*r.Number("bw", 0, true), 12.5);
  EXPECT_EQ(*r.Bool("b"), true);
  EXPECT_THAT(*r.StringListOr("list"), ::testing::ElementsAre("a", "b"));
  EXPECT_TRUE(r.StringListOr("absent")->empty());
  EXPECT_EQ(std::string(r.StringListOr("bad_list").status().message()),
            "cluster.yaml: node_groups[1].bad_list[1]: must be a non-empty "
            "string, got 1");
  EXPECT_EQ(std::string(r.Number("zero", 0, true).status().message()),
            "cluster.yaml: node_groups[1].zero: must be a number > 0, got 0");
  EXPECT_EQ(std::string(r.Bool("s").status().message()),
            "cluster.yaml: node_groups[1].s: must be true or false, got \"x\"");
  EXPECT_EQ(*r.IntOr("absent", 7), 7);
  EXPECT_EQ(*r.StringOr("absent", "d"), "d");
  EXPECT_DOUBLE_EQ(*r.NumberOr("absent", 100, 0, true), 100);
  ObjectReader obj = *r.Object("obj");
  EXPECT_EQ(obj.path(), "node_groups[1].obj");
  EXPECT_EQ(std::string(r.Object("s").status().message()),
            "cluster.yaml: node_groups[1].s: must be a mapping (object), got "
            "\"x\"");
  EXPECT_EQ(std::string(r.Array("s").status().message()),
            "cluster.yaml: node_groups[1].s: must be a list, got \"x\"");
}

TEST(ObjectReaderTopLevelTest, TopLevelPathIsOmitted) {
  Json j = Json::parse(R"({"x": 1})");
  ObjectReader r = *ObjectReader::Create(j, "f.yaml", "");
  EXPECT_EQ(std::string(r.AllowOnly({"y"}).message()),
            "f.yaml: unknown field \"x\" (allowed: y)");
  EXPECT_EQ(std::string(r.Error("x", "bad").message()), "f.yaml: x: bad");
  EXPECT_EQ(
      std::string(
          ObjectReader::Create(Json::array(), "f.yaml", "").status().message()),
      "f.yaml: must be a mapping (object), got []");
}

}  // namespace
}  // namespace arachne
