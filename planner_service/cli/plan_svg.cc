#include "planner_service/cli/plan_svg.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace arachne {
namespace {

constexpr int kWidth = 960;
constexpr int kLeft = 150;
constexpr int kRowHeight = 26;
constexpr int kMaxRowsPerTemplate = 4;
// Distinguishable fills, one per GPU type in order of appearance.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                                    "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string RenderPlanSvg(const Plan& plan, const Prediction& p,
                          const CostModel& cm) {
  const Cluster& cluster = cm.cluster();
  const int layers = cm.model().num_layers;
  std::string body;
  int y = 56;
  for (size_t j = 0; j < plan.templates.size(); ++j) {
    const Template& t = plan.templates[j];
    absl::StrAppendFormat(
        &body,
        "<text x=\"10\" y=\"%d\" font-weight=\"bold\">template %d: %d "
        "replicas x %d stages, micro-batch %d, %d micro-batches per "
        "replica</text>\n",
        y, j + 1, t.replicas, t.depth(), t.micro_batch_size,
        t.max_micro_batches());
    y += 8;
    const int rows = std::min(t.replicas, kMaxRowsPerTemplate);
    for (int r = 0; r < rows; ++r) {
      absl::StrAppendFormat(&body,
                            "<text x=\"10\" y=\"%d\">replica %d</text>\n",
                            y + 17, r + 1);
      for (int s = 0; s < t.depth(); ++s) {
        const Stage& st = t.stages[s];
        const double x0 = kLeft + (kWidth - kLeft - 10) *
                                      static_cast<double>(st.layer_begin) / layers;
        const double w = (kWidth - kLeft - 10) *
                         static_cast<double>(st.num_layers()) / layers;
        const auto& types = cluster.types_present();
        const int color = static_cast<int>(
            std::find(types.begin(), types.end(), st.gpu_type) - types.begin());
        const std::string label = absl::StrCat(
            cm.catalog().type(st.gpu_type).id, " tp", st.tp, " L",
            st.layer_begin, "-", st.layer_end);
        absl::StrAppendFormat(
            &body,
            "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" "
            "fill=\"%s\" stroke=\"white\"><title>%s on %s</title></rect>\n",
            x0, y, w, kRowHeight - 4, kPalette[color % 8], Escape(label),
            Escape(cluster.node(t.at(r, s).node).name));
        if (w > 60) {
          absl::StrAppendFormat(
              &body,
              "<text x=\"%.1f\" y=\"%d\" fill=\"white\" font-size=\"11\">%s"
              "</text>\n",
              x0 + 4, y + 15, Escape(label));
        }
      }
      y += kRowHeight;
    }
    if (t.replicas > rows) {
      absl::StrAppendFormat(&body,
                            "<text x=\"%d\" y=\"%d\" font-style=\"italic\">... "
                            "and %d more replicas like these</text>\n",
                            kLeft, y + 12, t.replicas - rows);
      y += 18;
    }
    y += 22;
  }
  // Legend.
  int x = 10;
  for (size_t i = 0; i < cluster.types_present().size(); ++i) {
    const int type = cluster.types_present()[i];
    absl::StrAppendFormat(
        &body,
        "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/>"
        "<text x=\"%d\" y=\"%d\">%s (%d GPUs)</text>\n",
        x, y, kPalette[i % 8], x + 20, y + 12, cm.catalog().type(type).id,
        cluster.GpusOfType(type));
    x += 200;
  }
  y += 30;
  const std::string title = absl::StrFormat(
      "%s on %d GPUs: %.3f s/iteration, %.0f tokens/s, MFU %.1f%%, %d GPUs "
      "unused (box width = share of the %d layers)",
      cm.model().name, cluster.total_gpus(), p.iteration_time_s,
      p.tokens_per_s, 100 * p.mfu, cluster.total_gpus() - plan.used_gpus(),
      layers);
  return absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"13\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"24\" font-size=\"15\">%s</text>\n%s</svg>\n",
      kWidth, y, Escape(title), body);
}

}  // namespace arachne
