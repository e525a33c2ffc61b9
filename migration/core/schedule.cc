#include "migration/core/schedule.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <utility>

#include "glog/logging.h"

namespace arachne::migration {
namespace {

// Resources a transfer occupies: the sender's send side, the receiver's
// receive side and, across nodes, both NICs. Indexed as below.
struct Resources {
  explicit Resources(const MigrationWorld& w)
      : world(w), load(2 * w.size() + 2 * w.num_nodes(), 0.0) {}
  int Send(int rank) const { return rank; }
  int Recv(int rank) const { return world.size() + rank; }
  int NicOut(int node) const { return 2 * world.size() + node; }
  int NicIn(int node) const {
    return 2 * world.size() + world.num_nodes() + node;
  }
  // The resources of a transfer; -1 where none.
  std::array<int, 4> Of(int sender, int receiver) const {
    std::array<int, 4> r = {Send(sender), Recv(receiver), -1, -1};
    if (!world.SameNode(sender, receiver)) {
      r[2] = NicOut(world.node_of(sender));
      r[3] = NicIn(world.node_of(receiver));
    }
    return r;
  }
  const MigrationWorld& world;
  std::vector<double> load;
};

struct Piece {
  int sender = 0;
  int receiver = 0;
  std::vector<TransferSegment> segments;
  int64_t bytes = 0;
  double time = 0;
  std::array<int, 4> resources{};
  int order = 0;  // creation order, the last tie-break
};

// The pair streams of `tuples` (sorted by sender, receiver) cut into pieces.
std::vector<Piece> CutPieces(const std::vector<const MigrationTuple*>& tuples,
                             const MigrationWorld& world,
                             const Resources& res, double quantum_s,
                             const ScheduleOptions& options) {
  std::vector<Piece> pieces;
  size_t i = 0;
  while (i < tuples.size()) {
    size_t j = i;
    int64_t pair_bytes = 0;
    while (j < tuples.size() && tuples[j]->sender == tuples[i]->sender &&
           tuples[j]->receiver == tuples[i]->receiver) {
      pair_bytes += tuples[j]->range.size();
      ++j;
    }
    const int sender = tuples[i]->sender, receiver = tuples[i]->receiver;
    const double bw = world.BytesPerSecond(sender, receiver);
    int64_t n = quantum_s > 0
                    ? static_cast<int64_t>(std::ceil(pair_bytes / bw / quantum_s))
                    : 1;
    n = std::min(n, std::max<int64_t>(1, pair_bytes / options.min_piece_bytes));
    n = std::max<int64_t>(n, 1);
    // Walk the stream, closing a piece at each cumulative boundary.
    int64_t offset = 0;  // bytes of the stream already assigned
    size_t t = i;
    int64_t within = 0;  // bytes of tuples[t] already assigned
    for (int64_t p = 0; p < n; ++p) {
      const int64_t end = pair_bytes * (p + 1) / n;
      Piece piece;
      piece.sender = sender;
      piece.receiver = receiver;
      while (offset < end) {
        const MigrationTuple& tu = *tuples[t];
        const int64_t take =
            std::min(tu.range.size() - within, end - offset);
        const int64_t b = tu.range.begin + within;
        piece.segments.push_back({tu.tensor, {b, b + take}});
        piece.bytes += take;
        offset += take;
        within += take;
        if (within == tu.range.size()) {
          ++t;
          within = 0;
        }
      }
      piece.time = piece.bytes / bw;
      piece.resources = res.Of(sender, receiver);
      piece.order = static_cast<int>(pieces.size());
      if (piece.bytes > 0) pieces.push_back(std::move(piece));
    }
    i = j;
  }
  return pieces;
}

// Greedy open-shop rounds. A round admits pieces in order of how loaded
// their busiest resource still is. A GPU sends to one peer and receives from
// one per round, but may take several pieces of that one pair (merged into
// one transfer); every resource holds up to one quantum of link time per
// round, and a NIC's pieces share its bandwidth. A resource idle so far in
// the round takes any piece, so oversized pieces still progress.
std::vector<Round> ScheduleStage(std::vector<const MigrationTuple*> tuples,
                                 const MigrationWorld& world,
                                 const ScheduleOptions& options,
                                 double* lower_bound_s) {
  std::vector<Round> rounds;
  *lower_bound_s = 0;
  if (tuples.empty()) return rounds;
  Resources res(world);
  const double lb = [&] {
    std::vector<MigrationTuple> copy;
    for (const MigrationTuple* t : tuples) copy.push_back(*t);
    return LowerBoundSeconds(copy, world);
  }();
  *lower_bound_s = lb;
  const double quantum = lb / std::max(1, options.target_rounds);
  std::vector<Piece> pieces = CutPieces(
      tuples, world, res, quantum / std::max(1, options.pieces_per_quantum),
      options);
  for (const Piece& p : pieces) {
    for (int r : p.resources) {
      if (r >= 0) res.load[r] += p.time;
    }
  }
  std::vector<double> priority(pieces.size());
  std::vector<int> remaining(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) remaining[i] = static_cast<int>(i);
  std::vector<double> in_round(res.load.size());
  std::vector<int> send_peer(world.size()), recv_peer(world.size());
  const double cap = quantum * (1 + 1e-9);
  while (!remaining.empty()) {
    for (int i : remaining) {
      double p = 0;
      for (int r : pieces[i].resources) {
        if (r >= 0) p = std::max(p, res.load[r]);
      }
      priority[i] = p;
    }
    std::sort(remaining.begin(), remaining.end(), [&](int a, int b) {
      return std::make_tuple(-priority[a], -pieces[a].time, pieces[a].order) <
             std::make_tuple(-priority[b], -pieces[b].time, pieces[b].order);
    });
    std::fill(in_round.begin(), in_round.end(), 0.0);
    std::fill(send_peer.begin(), send_peer.end(), -1);
    std::fill(recv_peer.begin(), recv_peer.end(), -1);
    std::vector<int> taken, left;
    for (int i : remaining) {
      const Piece& p = pieces[i];
      bool fits = (send_peer[p.sender] < 0 || send_peer[p.sender] == p.receiver) &&
                  (recv_peer[p.receiver] < 0 || recv_peer[p.receiver] == p.sender);
      for (int k = 0; k < 4 && fits; ++k) {
        const int r = p.resources[k];
        if (r >= 0 && in_round[r] > 0 && in_round[r] + p.time > cap) {
          fits = false;
        }
      }
      if (!fits) {
        left.push_back(i);
        continue;
      }
      send_peer[p.sender] = p.receiver;
      recv_peer[p.receiver] = p.sender;
      for (int r : p.resources) {
        if (r >= 0) {
          in_round[r] += p.time;
          res.load[r] -= p.time;
        }
      }
      taken.push_back(i);
    }
    CHECK(!taken.empty());
    // One transfer per pair, its pieces in stream order.
    std::sort(taken.begin(), taken.end(), [&](int a, int b) {
      return std::make_tuple(pieces[a].sender, pieces[a].order) <
             std::make_tuple(pieces[b].sender, pieces[b].order);
    });
    Round round;
    for (int i : taken) {
      Piece& p = pieces[i];
      if (round.transfers.empty() || round.transfers.back().sender != p.sender) {
        Transfer t;
        t.sender = p.sender;
        t.receiver = p.receiver;
        round.transfers.push_back(std::move(t));
      }
      Transfer& t = round.transfers.back();
      for (TransferSegment& seg : p.segments) {
        if (!t.segments.empty() && t.segments.back().tensor == seg.tensor &&
            t.segments.back().range.end == seg.range.begin) {
          t.segments.back().range.end = seg.range.end;
        } else {
          t.segments.push_back(seg);
        }
      }
      t.bytes += p.bytes;
      t.estimated_s += p.time;
    }
    for (double l : in_round) round.estimated_s = std::max(round.estimated_s, l);
    round.estimated_s += options.round_latency_s;
    rounds.push_back(std::move(round));
    remaining = std::move(left);
  }
  return rounds;
}

}  // namespace

double LowerBoundSeconds(const std::vector<MigrationTuple>& tuples,
                         const MigrationWorld& world) {
  Resources res(world);
  for (const MigrationTuple& t : tuples) {
    const double s = t.range.size() / world.BytesPerSecond(t.sender, t.receiver);
    for (int r : res.Of(t.sender, t.receiver)) {
      if (r >= 0) res.load[r] += s;
    }
  }
  double lb = 0;
  for (double l : res.load) lb = std::max(lb, l);
  return lb;
}

MigrationSchedule BuildSchedule(const StateDiff& diff,
                                const MigrationWorld& world,
                                const ScheduleOptions& options) {
  std::vector<const MigrationTuple*> by_stage[2];
  for (const MigrationTuple& t : diff.tuples) {
    CHECK(t.sender >= 0 && t.sender < world.size() && t.receiver >= 0 &&
          t.receiver < world.size())
        << "tuple ranks outside the world";
    CHECK(t.stage == 1 || t.stage == 2);
    by_stage[t.stage - 1].push_back(&t);
  }
  for (auto& v : by_stage) {
    std::stable_sort(v.begin(), v.end(),
                     [](const MigrationTuple* a, const MigrationTuple* b) {
                       return std::make_pair(a->sender, a->receiver) <
                              std::make_pair(b->sender, b->receiver);
                     });
  }
  MigrationSchedule s;
  s.stage1 = ScheduleStage(by_stage[0], world, options, &s.stage1_bound_s);
  s.stage2 = ScheduleStage(by_stage[1], world, options, &s.stage2_bound_s);
  for (const Round& r : s.stage1) s.stage1_s += r.estimated_s;
  for (const Round& r : s.stage2) s.stage2_s += r.estimated_s;
  s.makespan_s = s.stage1_s + s.stage2_s;
  s.lower_bound_s = LowerBoundSeconds(diff.tuples, world);
  s.bytes = diff.bytes_moved;
  return s;
}

}  // namespace arachne::migration
