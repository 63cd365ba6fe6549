// Checkpoints: save, load (resharding), consolidated tensors, safetensors.
// The format is described in checkpoint.hpp and docs/checkpoints.md.
#include "dlplan/exec/checkpoint.hpp"

#include "dlplan/exec/optimizer.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/output_file.hpp"
#include "dlplan/plan_io.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dlplan::exec {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kLatest = "latest";
constexpr int kSchemaVersion = 1;

std::string why() { return std::strerror(errno); }

std::string step_folder(int step) { return fmt::format("step-{:08d}", step); }
std::string shard_name(int rank) { return fmt::format("shard-{:05d}.bin", rank); }

// ---- numbers read from files ------------------------------------------------------
// nlohmann's get<int>() converts a float by a plain cast (undefined past the
// type's range: a fuzz finding); every count, offset and shape read from a
// manifest or a safetensors header comes through these instead.
int64_t int_of(const Json& v) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) throw Error(fmt::format("{} is too large", v.dump()));
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (!v.is_number_integer()) throw Error(fmt::format("{} is not an integer", v.dump()));
  return v.get<int64_t>();
}
int int32_of(const Json& v) {
  const int64_t i = int_of(v);
  if (i < INT_MIN || i > INT_MAX) throw Error(fmt::format("{} is out of range", i));
  return static_cast<int>(i);
}
Shape shape_of(const Json& v) {
  if (!v.is_array()) throw Error(fmt::format("shape {} is not an array", v.dump()));
  Shape s;
  for (const Json& d : v) s.push_back(int_of(d));
  return s;
}

// ---- files ---------------------------------------------------------------------

class File {
 public:
  File(const std::string& path, int flags, mode_t mode = 0666) : path_(path) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd_ < 0) throw Error(fmt::format("{}: cannot open ({})", path, why()));
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  void write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error(fmt::format("{}: write failed ({})", path_, n < 0 ? why() : "nothing written"));
      p += n;
      bytes -= static_cast<size_t>(n);
    }
  }
  void sync() {
    if (::fsync(fd_) != 0) throw Error(fmt::format("{}: fsync failed ({})", path_, why()));
  }
  void close() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw Error(fmt::format("{}: close failed ({})", path_, why()));
  }

 private:
  std::string path_;
  int fd_ = -1;
};

void sync_folder(const std::string& path) {
  File dir(path, O_RDONLY | O_DIRECTORY);
  dir.sync();
}

std::vector<char> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open ({})", path, why()));
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(fmt::format("{}: read failed", path));
  return data;
}

uint32_t crc_of(const char* data, size_t bytes, uint32_t crc = 0) {
  // zlib's CRC-32 (IEEE 802.3), in chunks its uInt length can hold.
  uLong c = crc;
  while (bytes > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(data), n);
    data += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(c);
}

// ---- identity ----------------------------------------------------------------------

std::string model_hash(const PlanDocument& plan) {
  // The model as planned (its IR, sequence length applied), keys sorted,
  // hashed as plans are (FNV-1a 64 of the sorted dump).
  // A fine-tuning plan's adapters and frozen set are part of the model.
  if (plan.document.contains("fine_tuning"))
    return plan_content_hash(Json{{"ir", plan.document.at("model").at("ir")}, {"fine_tuning", plan.document.at("fine_tuning")}});
  return plan_content_hash(Json(plan.document.at("model").at("ir")));
}

// The range of unit u rank r saves: what it owns under ZeRO, else a 1/N
// share. Hybrid sharding's first group saves every shard; the replicas in
// the other groups hold the same values and save none.
std::pair<int64_t, int64_t> saved_range(const ParamStore& s, int u) {
  if (s.sharded() && s.replica() > 0) return {s.owned_begin(u), s.owned_begin(u)};
  if (s.sharded()) return {s.owned_begin(u), s.owned_begin(u) + s.owned_size(u)};
  const int64_t P = s.unit_size(u), share = (P + s.world() - 1) / s.world();
  return {std::min(P, s.rank() * share), std::min(P, (s.rank() + 1) * share)};
}

bool params_sharded(const ParamStore& s) { return sharding(s.strategy(), s.world()).params; }

// ---- collective error handling -------------------------------------------------------

// Every rank learns whether any failed, and which (the lowest) with its message
// printed by that rank's caller: `detail` is non-empty on the failing rank.
void agree(Communicator& comm, const std::string& local_error, const std::string& what) {
  Communicator& host = comm.host();
  // max of (size - rank): the lowest failing rank.
  const double v = local_error.empty() ? 0.0 : static_cast<double>(comm.size() - comm.rank());
  std::vector<double> all(static_cast<size_t>(host.size()));
  host.all_gather_bytes(&v, all.data(), sizeof v);
  const double worst = *std::max_element(all.begin(), all.end());
  if (worst == 0) return;
  const int rank = comm.size() - static_cast<int>(worst);
  throw CheckpointError(fmt::format("{} failed on rank {}", what, rank), rank, rank == comm.rank() ? local_error : "");
}

// ---- manifest ----------------------------------------------------------------------

struct Manifest {
  std::string folder;  // the checkpoint's folder
  Json j;
  int step = 0;
  int world = 0;
  std::vector<std::string> states;
};

// The manifest's layout holds together, so that nothing read from it can
// index outside what it describes: each unit's ranges tile [0, size) across
// the shards, each shard's offsets follow from its ranges and its byte count
// from both, parameters lie inside their unit, shard files are named as
// dlplan names them (no other path is ever opened). Throws Error (or a JSON
// exception for a missing or mistyped field).
void validate_layout(Manifest& m) {
  const int64_t states = static_cast<int64_t>(m.states.size());
  if (states > 3 || std::set<std::string>(m.states.begin(), m.states.end()).size() != m.states.size())
    throw Error("states must be \"params\" and up to two distinct optimizer moments");
  const Json& units = m.j.at("units");
  const Json& shards = m.j.at("shards");
  if (!units.is_array() || !shards.is_array()) throw Error("units and shards must be arrays");
  std::vector<int64_t> size;
  for (size_t u = 0; u < units.size(); ++u) {
    if (int_of(units[u].at("unit")) != static_cast<int64_t>(u)) throw Error(fmt::format("units[{}] is not unit {}", u, u));
    const auto P = int_of(units[u].at("size"));
    if (P < 0 || P > (int64_t{1} << 46)) throw Error(fmt::format("unit {}: size {} out of range", u, P));
    size.push_back(P);
    for (const Json& p : units[u].at("params")) {
      const auto off = int_of(p.at("offset")), n = int_of(p.at("numel"));
      double elements = 1;
      for (int64_t d : shape_of(p.at("shape"))) elements *= d < 0 ? -1.0 : static_cast<double>(d);
      if (off < 0 || n < 0 || off > P - n || elements != static_cast<double>(n))
        throw Error(fmt::format("unit {}: parameter '{}' lies outside the unit or its shape is not its numel", u,
                                p.at("name").get<std::string>()));
    }
  }
  int64_t buffer_values = 0;
  for (const Json& b : m.j.at("buffers")) {
    const auto n = int_of(b.at("numel"));
    double elements = 1;
    for (int64_t d : shape_of(b.at("shape"))) elements *= d < 0 ? -1.0 : static_cast<double>(d);
    if (n < 0 || n > (int64_t{1} << 40) || elements != static_cast<double>(n))
      throw Error(fmt::format("buffer '{}': numel out of range or not its shape", b.at("name").get<std::string>()));
    buffer_values += n;
  }
  std::vector<std::vector<std::pair<int64_t, int64_t>>> covered(size.size());
  for (size_t r = 0; r < shards.size(); ++r) {
    const Json& s = shards[r];
    if (int_of(s.at("rank")) != static_cast<int64_t>(r) || s.at("file").get<std::string>() != shard_name(static_cast<int>(r)))
      throw Error(fmt::format("shards[{}] must be rank {} in {}", r, r, shard_name(static_cast<int>(r))));
    const Json& ranges = s.at("ranges");
    if (ranges.size() != size.size()) throw Error(fmt::format("shard {} has {} ranges for {} units", r, ranges.size(), size.size()));
    int64_t at = 0;
    for (size_t u = 0; u < ranges.size(); ++u) {
      const Json& q = ranges[u];
      const auto b = int_of(q.at("begin")), e = int_of(q.at("end"));
      if (int_of(q.at("unit")) != static_cast<int64_t>(u) || b < 0 || e < b || e > size[u] || int_of(q.at("offset")) != at)
        throw Error(fmt::format("shard {}: range {} is out of place", r, u));
      covered[u].emplace_back(b, e);
      at += (e - b) * states * 4;
    }
    if (int_of(s.at("buffers").at("count")) != buffer_values || int_of(s.at("buffers").at("offset")) != at ||
        int_of(s.at("bytes")) != at + buffer_values * 4)
      throw Error(fmt::format("shard {}: its bytes and buffers do not follow from its ranges", r));
  }
  for (size_t u = 0; u < covered.size(); ++u) {
    auto& c = covered[u];
    std::sort(c.begin(), c.end());
    int64_t next = 0;
    for (const auto& [b, e] : c) {
      if (b != next && e > b) throw Error(fmt::format("unit {}: the shards' ranges leave a gap or overlap at {}", u, next));
      next = std::max(next, e);
    }
    if (next != size[u]) throw Error(fmt::format("unit {}: the shards cover {} of {} values", u, next, size[u]));
  }
}

Manifest read_manifest(const std::string& dir) {
  const std::string latest = (fs::path(dir) / kLatest).string();
  std::ifstream in(latest);
  if (!in) throw Error(fmt::format("{}: cannot read ({})", latest, why()));
  std::string name;
  std::getline(in, name);
  if (name.empty() || name.find('/') != std::string::npos || name.rfind("step-", 0) != 0)
    throw Error(fmt::format("{}: names '{}', not a checkpoint folder step-NNNNNNNN", latest, name));
  Manifest m;
  m.folder = (fs::path(dir) / name).string();
  const std::string path = (fs::path(m.folder) / "manifest.json").string();
  const std::vector<char> text = read_whole(path);
  try {
    m.j = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  try {
    if (m.j.value("kind", "") != "checkpoint") throw Error("\"kind\" is not \"checkpoint\"");
    if (int32_of(m.j.at("schema_version")) != kSchemaVersion)
      throw Error(fmt::format("schema_version {} (this dlplan reads {})", m.j.at("schema_version").dump(), kSchemaVersion));
    m.step = int32_of(m.j.at("step"));
    m.world = int32_of(m.j.at("world_size"));
    m.states = m.j.at("states").get<std::vector<std::string>>();
    if (m.step < 0 || m.world < 1 || m.states.empty() || m.states[0] != "params")
      throw Error("step, world_size or states out of range");
    if (m.j.at("shards").size() != static_cast<size_t>(m.world))
      throw Error(fmt::format("{} shards for a world of {}", m.j.at("shards").size(), m.world));
    validate_layout(m);
  } catch (const Json::exception& e) {
    throw Error(fmt::format("{}: not a dlplan checkpoint manifest ({})", path, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: not a dlplan checkpoint manifest: {}", path, e.what()));
  }
  return m;
}

// One shard's file, read and checked against the manifest (size and CRC-32).
std::vector<char> read_shard(const Manifest& m, const Json& shard) {
  const std::string path = (fs::path(m.folder) / shard.at("file").get<std::string>()).string();
  std::vector<char> data = read_whole(path);
  const auto bytes = int_of(shard.at("bytes"));
  if (static_cast<int64_t>(data.size()) != bytes)
    throw Error(fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced)", path, data.size(), bytes));
  const std::string crc = fmt::format("{:08x}", crc_of(data.data(), data.size()));
  if (crc != shard.at("crc32").get<std::string>())
    throw Error(fmt::format("{}: CRC-32 {} does not match the manifest's {} (the file is corrupted)", path, crc,
                           shard.at("crc32").get<std::string>()));
  return data;
}

// Copies, from every shard, the part of unit u's state `state` in [lo, hi)
// into out (hi - lo values); throws when the shards do not cover it.
class ShardReader {
 public:
  explicit ShardReader(const Manifest& m) : m_(m) {}

  // Registers a request; fulfilled by run().
  void want(int unit, int state, int64_t lo, int64_t hi, float* out) {
    if (hi > lo) wants_.push_back({unit, state, lo, hi, out, 0});
  }

  // And one shard's BatchNorm running statistics (the manifest's count of them).
  void want_buffers(int rank, std::vector<float>& out) {
    buffers_rank_ = rank;
    buffers_ = &out;
  }

  // Reads each shard file something wants once, checking its size and CRC-32.
  void run() {
    for (const Json& shard : m_.j.at("shards")) {
      const int rank = int32_of(shard.at("rank"));
      bool needed = buffers_ && rank == buffers_rank_;  // read only the files something wants
      for (const Json& r : shard.at("ranges"))
        for (const Want& w : wants_)
          needed |= int32_of(r.at("unit")) == w.unit && int_of(r.at("begin")) < w.hi &&
                    int_of(r.at("end")) > w.lo;
      if (!needed) continue;
      const std::vector<char> data = read_shard(m_, shard);
      for (const Json& r : shard.at("ranges")) {
        const int unit = int32_of(r.at("unit"));
        const int64_t begin = int_of(r.at("begin")), end = int_of(r.at("end"));
        const int64_t at = int_of(r.at("offset"));
        for (Want& w : wants_) {
          if (w.unit != unit) continue;
          const int64_t lo = std::max(begin, w.lo), hi = std::min(end, w.hi);
          if (hi <= lo) continue;
          const int64_t from = at + (static_cast<int64_t>(w.state) * (end - begin) + (lo - begin)) * 4;
          if (from < 0 || from + (hi - lo) * 4 > static_cast<int64_t>(data.size()))
            throw Error(fmt::format("{}: range of unit {} outside its shard file", m_.folder, unit));
          std::memcpy(w.out + (lo - w.lo), data.data() + from, static_cast<size_t>(hi - lo) * 4);
          w.filled += hi - lo;
        }
      }
      if (buffers_ && rank == buffers_rank_) {  // the layout was validated: count and offset lie in the file
        const Json& b = shard.at("buffers");
        buffers_->resize(static_cast<size_t>(int_of(b.at("count"))));
        if (!buffers_->empty()) std::memcpy(buffers_->data(), data.data() + int_of(b.at("offset")), buffers_->size() * 4);
      }
    }
    for (const Want& w : wants_)
      if (w.filled != w.hi - w.lo)
        throw Error(fmt::format("{}: the shards hold {} of the {} values of unit {} [{}, {}) ({})", m_.folder, w.filled,
                               w.hi - w.lo, w.unit, w.lo, w.hi, m_.states[static_cast<size_t>(w.state)]));
  }

 private:
  struct Want {
    int unit, state;
    int64_t lo, hi;
    float* out;
    int64_t filled;
  };
  const Manifest& m_;
  std::vector<Want> wants_;
  int buffers_rank_ = -1;
  std::vector<float>* buffers_ = nullptr;
};

// The manifest's model against the plan's: the same parameters, unit by unit.
void check_model(const Manifest& m, const PlanDocument& plan, const CheckpointRun& run) {
  const std::string where = (fs::path(m.folder) / "manifest.json").string();
  const Json& id = m.j.at("plan");
  if (id.at("model_hash").get<std::string>() != model_hash(plan)) {
    std::string detail;
    const Json& units = m.j.at("units");
    for (const ParamInfo& p : plan.model.params) {
      bool found = false;
      for (const Json& u : units)
        for (const Json& t : u.at("params"))
          if (t.at("name").get<std::string>() == p.name) {
            found = true;
            if (int_of(t.at("numel")) != p.numel && detail.empty())
              detail = fmt::format(": its '{}' has {} elements, the plan's {}", p.name, int_of(t.at("numel")), p.numel);
          }
      if (!found && detail.empty()) detail = fmt::format(": it has no parameter '{}'", p.name);
    }
    throw Error(fmt::format("{}: a checkpoint of model '{}', not of this plan's model '{}' (the IR differs{})", where,
                            id.value("model", "?"), plan.model.name, detail));
  }
  if (static_cast<uint64_t>(int_of(m.j.at("seed"))) != run.seed)
    throw Error(fmt::format("{}: trained with --seed {}; resume with the same seed (data and dropout follow it), not {}",
                            where, static_cast<uint64_t>(int_of(m.j.at("seed"))), run.seed));
  if (int32_of(m.j.at("total_steps")) != run.total_steps)
    throw Error(fmt::format("{}: the run was started with --steps {} (the learning-rate schedule's total); --steps {} "
                            "would change the schedule: resume with --steps {}",
                            where, int32_of(m.j.at("total_steps")), run.total_steps, int32_of(m.j.at("total_steps"))));
  if (m.step > run.total_steps)
    throw Error(fmt::format("{}: at step {}, past --steps {}", where, m.step, run.total_steps));
  if (plan.training.fine_tuning.active()) {
    // The frozen base is rebuilt, not read: from the same --init, or the seed.
    const std::string saved = m.j.value("frozen_base", "seed");
    const std::string now = run.init.empty() ? std::string("seed") : fs::path(run.init).filename().string();
    if (saved != now)
      throw Error(fmt::format("{}: the frozen base of this fine-tuning run came from {}; resume with {}", where,
                              saved == "seed" ? "the seed (no --init)" : "--init " + saved,
                              saved == "seed" ? "no --init" : "--init " + saved));
  }
  const std::string optimizer = to_string(plan.training.optimizer.kind);
  if (m.j.at("optimizer").get<std::string>() != optimizer)
    throw Error(fmt::format("{}: saved with optimizer {}, the plan uses {}", where, m.j.at("optimizer").get<std::string>(),
                            optimizer));
}

}  // namespace

// ---- save ------------------------------------------------------------------------------

std::string save_checkpoint(const std::string& dir, Trainer& trainer, Communicator& comm, const CheckpointRun& run) {
  ParamStore& store = trainer.store();
  Optimizer& opt = trainer.optimizer();
  const PlanDocument& plan = trainer.plan();
  DeviceOps& ops = store.ops();
  const int step = trainer.steps_done();
  const std::string name = step_folder(step);
  const std::string tmp = (fs::path(dir) / (".tmp-" + name)).string();
  const std::string final_folder = (fs::path(dir) / name).string();
  const bool root = comm.rank() == 0;
  const std::string what = fmt::format("saving the checkpoint of step {} into {}", step, dir);

  std::string error;
  if (root) {
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) throw Error(fmt::format("{}: cannot create the folder ({})", dir, ec.message()));
      fs::remove_all(tmp, ec);  // a save interrupted earlier
      if (!fs::create_directory(tmp, ec) || ec)
        throw Error(fmt::format("{}: cannot create ({})", tmp, ec ? ec.message() : "exists"));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(comm, error, what);

  // This rank's shard: for each unit its range of every state, fp32. What
  // rank 0 needs for the manifest, as int64 records of the same length on
  // every rank: (begin, end, byte offset) per unit, then the buffers' count
  // and offset, the file's size and its CRC-32.
  std::vector<int64_t> record;
  uint32_t crc = 0;
  int64_t bytes = 0;
  std::vector<std::string> states = {"params"};
  for (const auto& [k, t] : opt.state(0))
    if (k != "master") states.push_back(k);
  try {
    const std::string path = (fs::path(tmp) / shard_name(comm.rank())).string();
    File f(path, O_WRONLY | O_CREAT | O_TRUNC);
    auto put = [&](const std::vector<float>& v) {
      const size_t n = v.size() * sizeof(float);
      f.write(v.data(), n);
      crc = crc_of(reinterpret_cast<const char*>(v.data()), n, crc);
      bytes += static_cast<int64_t>(n);
    };
    for (int u = 0; u < store.units(); ++u) {
      const auto [lo, hi] = saved_range(store, u);
      const int64_t ob = store.owned_begin(u), L = hi - lo;
      const auto state = opt.state(u);
      std::vector<std::pair<std::string, Tensor>> moments;
      const Tensor* master = nullptr;
      for (const auto& [k, t] : state) {
        if (k == "master") master = &t;
        else moments.emplace_back(k, t);
      }
      record.insert(record.end(), {lo, hi, bytes});
      std::vector<float> v(static_cast<size_t>(L));
      if (L > 0) {
        if (master) ops.download(v.data(), master->f() + (lo - ob), L * 4);
        else ops.download_floats(v.data(), store.owned_params(u).sub(lo - ob, L));
      }
      put(v);
      for (const auto& [k, t] : moments) {
        if (L > 0) ops.download(v.data(), t.f() + (lo - ob), L * 4);
        put(v);
      }
      if (run.kill_mid_save && u == store.units() / 2) {
        // Test hook (DLPLAN_FAULT=R:S:kill-in-save): die here, half written.
        f.sync();
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
    }
    if (run.fail_write) {  // test hook: a full disk, half-way
      errno = ENOSPC;
      throw Error(fmt::format("{}: write failed ({}; injected by DLPLAN_FAULT)", path, why()));
    }
    const std::vector<float> buffers = trainer.buffers();
    record.insert(record.end(), {static_cast<int64_t>(buffers.size()), bytes});
    put(buffers);
    f.sync();
    f.close();
    record.insert(record.end(), {bytes, static_cast<int64_t>(crc)});
  } catch (const std::exception& e) {
    error = e.what();
  }
  try {
    agree(comm, error, what);
  } catch (const CheckpointError&) {
    std::error_code ec;
    if (root) fs::remove_all(tmp, ec);  // the shards written; the previous checkpoint stays
    throw;
  }

  // Rank 0 gathers every rank's record and writes the manifest.
  std::string manifest_text;  // rank 0's
  {
    const size_t n = static_cast<size_t>(store.units()) * 3 + 4;
    record.resize(n);  // a rank that failed above has thrown already
    std::vector<int64_t> every(n * static_cast<size_t>(comm.size()));
    comm.host().all_gather_bytes(record.data(), every.data(), static_cast<int64_t>(n * sizeof(int64_t)));
    if (root) {
      Json shards = Json::array();
      for (int r = 0; r < comm.size(); ++r) {
        Json rr = Json::array();
        const int64_t* p = every.data() + static_cast<size_t>(r) * n;
        for (int u = 0; u < store.units(); ++u, p += 3)
          rr.push_back({{"unit", u}, {"begin", p[0]}, {"end", p[1]}, {"offset", p[2]}});
        shards.push_back({{"rank", r},
                          {"file", shard_name(r)},
                          {"bytes", p[2]},
                          {"crc32", fmt::format("{:08x}", static_cast<uint32_t>(p[3]))},
                          {"ranges", rr},
                          {"buffers", {{"count", p[0]}, {"offset", p[1]}}}});
      }
      Json units = Json::array();
      for (int u = 0; u < store.units(); ++u) units.push_back({{"unit", u}, {"size", store.unit_size(u)}, {"params", Json::array()}});
      for (size_t k = 0; k < plan.model.params.size(); ++k) {
        if (!store.trainable(static_cast<int>(k))) continue;  // the frozen base is not saved (CheckpointRun::init)
        const ParamInfo& p = plan.model.params[k];
        const auto [u, off] = store.locate(static_cast<int>(k));
        units[static_cast<size_t>(u)]["params"].push_back(
            {{"name", p.name}, {"shape", p.shape.empty() ? Shape{p.numel} : p.shape}, {"numel", p.numel}, {"offset", off}});
      }
      Json buffers = Json::array();
      for (const ParamInfo& b : plan.model.buffers)
        buffers.push_back({{"name", b.name}, {"shape", b.shape.empty() ? Shape{b.numel} : b.shape}, {"numel", b.numel}});
      Json manifest = {{"kind", "checkpoint"},
                       {"schema_version", kSchemaVersion},
                       {"step", step},
                       {"total_steps", run.total_steps},
                       {"seed", run.seed},
                       {"world_size", comm.size()},
                       {"strategy", to_string(plan.training.strategy)},
                       {"precision", to_string(plan.training.precision)},
                       {"optimizer", to_string(plan.training.optimizer.kind)},
                       {"plan",
                        {{"path", plan.path},
                         {"content_hash", plan.document.value("content_hash", "")},
                         {"model", plan.model.name},
                         {"model_hash", model_hash(plan)}}},
                       {"dtype", "f32"},
                       {"states", states},
                       {"units", units},
                       {"buffers", buffers},
                       {"shards", shards}};
      // Adam's bias-correction count (fewer than the steps when fp16-mixed
      // skipped some) and the dynamic loss scale.
      manifest["optimizer_steps"] = opt.steps_taken();
      if (plan.training.fine_tuning.active())  // where the frozen base came from
        manifest["frozen_base"] = run.init.empty() ? std::string("seed") : fs::path(run.init).filename().string();
      if (loss_scaled(plan.training.precision))
        manifest["loss_scale"] = {{"scale", trainer.loss_scale().scale}, {"good_steps", trainer.loss_scale().good_steps}};
      manifest_text = manifest.dump(1);
    }
  }
  error.clear();
  if (root) {
    try {
      write_output_file((fs::path(tmp) / "manifest.json").string(), manifest_text + "\n");
      sync_folder(tmp);
      std::error_code ec;
      if (fs::exists(final_folder, ec)) fs::remove_all(final_folder, ec);  // this step saved before (a rerun)
      if (std::rename(tmp.c_str(), final_folder.c_str()) != 0)
        throw Error(fmt::format("{}: cannot rename to {} ({})", tmp, final_folder, why()));
      sync_folder(dir);
      write_output_file((fs::path(dir) / kLatest).string(), name + "\n");
      sync_folder(dir);
    } catch (const std::exception& e) {
      error = e.what();
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
  }
  agree(comm, error, what);
  return final_folder;
}

// ---- load ------------------------------------------------------------------------------

int load_checkpoint(const std::string& dir, Trainer& trainer, Communicator& comm, const CheckpointRun& run) {
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / kLatest, ec)) return -1;
  ParamStore& store = trainer.store();
  Optimizer& opt = trainer.optimizer();
  DeviceOps& ops = store.ops();
  int step = -1, optimizer_steps = -1;
  std::optional<LossScaleState> scale;
  std::string error;
  try {
    const Manifest m = read_manifest(dir);
    check_model(m, trainer.plan(), run);
    if (m.j.contains("optimizer_steps")) optimizer_steps = int32_of(m.j.at("optimizer_steps"));
    if (loss_scaled(trainer.plan().training.precision)) {
      if (!m.j.contains("loss_scale"))
        throw Error(fmt::format("{}/manifest.json: holds no loss scale; it was not saved by an fp16-mixed run", m.folder));
      const Json& ls = m.j.at("loss_scale");
      LossScaleState s;
      s.scale = ls.at("scale").get<double>();
      s.good_steps = int32_of(ls.at("good_steps"));
      if (!(s.scale > 0) || !std::isfinite(s.scale) || s.good_steps < 0)
        throw Error(fmt::format("{}/manifest.json: loss_scale out of range", m.folder));
      scale = s;
    }
    ShardReader reader(m);
    const bool full = !params_sharded(store);
    std::vector<std::vector<float>> params(static_cast<size_t>(store.units()));
    std::vector<std::vector<std::vector<float>>> moments(static_cast<size_t>(store.units()));
    for (int u = 0; u < store.units(); ++u) {
      const int64_t ob = store.owned_begin(u), os = store.owned_size(u);
      const int64_t lo = full ? 0 : ob, hi = full ? store.unit_size(u) : ob + os;
      auto& p = params[static_cast<size_t>(u)];
      p.resize(static_cast<size_t>(hi - lo));
      reader.want(u, 0, lo, hi, p.data());
      const auto state = opt.state(u);
      int k = 0;
      for (const auto& [name, t] : state) {
        if (name == "master") continue;
        ++k;
        const auto it = std::find(m.states.begin(), m.states.end(), name);
        if (it == m.states.end())
          throw Error(fmt::format("{}/manifest.json: holds no optimizer state '{}'", m.folder, name));
        auto& v = moments[static_cast<size_t>(u)].emplace_back(static_cast<size_t>(os));
        reader.want(u, static_cast<int>(it - m.states.begin()), ob, ob + os, v.data());
      }
      if (k + 1 != static_cast<int>(m.states.size()))
        throw Error(fmt::format("{}/manifest.json: states {} do not match the optimizer's", m.folder, Json(m.states).dump()));
    }
    // Buffers (BN running statistics): this rank's own at the same world
    // size, else rank 0's.
    std::vector<float> buffers;
    reader.want_buffers(m.world == comm.size() ? comm.rank() : 0, buffers);
    reader.run();
    int64_t expected = 0;
    for (const ParamInfo& b : trainer.plan().model.buffers) expected += b.numel;
    if (static_cast<int64_t>(buffers.size()) != expected)
      throw Error(fmt::format("{}/manifest.json: {} buffer values, the model has {}", m.folder, buffers.size(), expected));

    // Into the trainer: parameters (rounded to bf16 under bf16-mixed), the
    // fp32 master copy of the owned slice, the moments, the buffers.
    for (int u = 0; u < store.units(); ++u) {
      const int64_t ob = store.owned_begin(u), os = store.owned_size(u);
      const auto& p = params[static_cast<size_t>(u)];
      ops.upload_floats(store.params(u).span().sub(0, static_cast<int64_t>(p.size())), p.data());
      const float* owned = p.data() + (full ? ob : 0);
      int k = 0;
      for (const auto& [name, t] : opt.state(u)) {
        if (name == "master") {
          if (os > 0) ops.upload(t.f(), owned, os * 4);
        } else {
          if (os > 0) ops.upload(t.f(), moments[static_cast<size_t>(u)][static_cast<size_t>(k)].data(), os * 4);
          ++k;
        }
      }
    }
    size_t at = 0;
    const Model& model = trainer.plan().model;
    for (size_t i = 0; i < model.nodes.size(); ++i)
      for (const Tensor& t : store.buffer_views(static_cast<int>(i))) {
        ops.upload(t.f(), buffers.data() + at, t.bytes());
        at += static_cast<size_t>(t.numel());
      }
    ops.synchronize();
    step = m.step;
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(comm, error, fmt::format("loading the checkpoint in {}", dir));
  trainer.resume_at(step);
  if (optimizer_steps >= 0) opt.set_steps_taken(optimizer_steps);
  if (scale) trainer.set_loss_scale(*scale);
  return step;
}

// ---- consolidated ------------------------------------------------------------------------

std::vector<NamedTensor> read_checkpoint_tensors(const std::string& dir, int* step) {
  const Manifest m = read_manifest(dir);
  // The shard files are what the manifest says before anything is allocated
  // for them (their checksums are checked as they are read).
  for (const Json& s : m.j.at("shards")) {
    const std::string path = (fs::path(m.folder) / s.at("file").get<std::string>()).string();
    std::error_code ec;
    const auto bytes = fs::file_size(path, ec);
    if (ec) throw Error(fmt::format("{}: cannot open ({})", path, ec.message()));
    if (static_cast<int64_t>(bytes) != int_of(s.at("bytes")))
      throw Error(fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced)", path, bytes, int_of(s.at("bytes"))));
  }
  ShardReader reader(m);
  std::vector<NamedTensor> out;
  std::vector<std::pair<int, int64_t>> where;
  try {
    for (const Json& u : m.j.at("units"))
      for (const Json& p : u.at("params")) {
        NamedTensor t;
        t.name = p.at("name").get<std::string>();
        t.shape = shape_of(p.at("shape"));
        const auto n = int_of(p.at("numel"));
        if (n < 0 || numel(t.shape) != n) throw Error(fmt::format("parameter '{}': shape and numel disagree", t.name));
        t.values.resize(static_cast<size_t>(n));
        out.push_back(std::move(t));
        where.emplace_back(int32_of(u.at("unit")), int_of(p.at("offset")));
      }
  } catch (const Json::exception& e) {
    throw Error(fmt::format("{}/manifest.json: bad units ({})", m.folder, e.what()));
  }
  for (size_t i = 0; i < out.size(); ++i)
    reader.want(where[i].first, 0, where[i].second, where[i].second + static_cast<int64_t>(out[i].values.size()),
                out[i].values.data());
  std::vector<float> buffers;  // BN running statistics: rank 0's
  reader.want_buffers(0, buffers);
  reader.run();
  size_t at = 0;  // the layout was validated: the manifest's buffers are rank 0's count
  for (const Json& b : m.j.at("buffers")) {
    NamedTensor t;
    t.name = b.at("name").get<std::string>();
    t.shape = shape_of(b.at("shape"));
    t.values.assign(buffers.begin() + static_cast<std::ptrdiff_t>(at),
                    buffers.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(int_of(b.at("numel")))));
    at += t.values.size();
    out.push_back(std::move(t));
  }
  if (step) *step = m.step;
  return out;
}

// ---- safetensors ---------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
  Json header = Json::object();
  Json meta = Json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  int64_t at = 0;
  for (const NamedTensor& t : tensors) {
    const int64_t bytes = static_cast<int64_t>(t.values.size()) * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const std::string tmp = path + ".tmp";
  try {
    File f(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
    f.write(len, 8);
    f.write(text.data(), text.size());
    for (const NamedTensor& t : tensors) f.write(t.values.data(), t.values.size() * 4);  // little-endian host
    f.sync();
    f.close();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = why();
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: cannot rename into place ({})", path, e));
  }
}

std::vector<NamedTensor> read_safetensors(const std::string& path) {
  const std::vector<char> data = read_whole(path);
  auto bad = [&](const std::string& why_not) { return Error(fmt::format("{}: not a safetensors file: {}", path, why_not)); };
  if (data.size() < 8) throw bad("shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(data[static_cast<size_t>(i)]);
  if (n > data.size() - 8) throw bad(fmt::format("header length {} beyond the file's {} bytes", n, data.size()));
  Json header;
  try {
    header = Json::parse(data.begin() + 8, data.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const Json::exception& e) {
    throw bad(fmt::format("header is not JSON ({})", e.what()));
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  const size_t base = 8 + n;
  std::vector<NamedTensor> out;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      NamedTensor t;
      t.name = name;
      t.shape = shape_of(v.at("shape"));
      const std::string dtype = v.at("dtype").get<std::string>();
      const Json& offsets = v.at("data_offsets");
      if (!offsets.is_array() || offsets.size() != 2) throw bad(fmt::format("tensor '{}': data_offsets is not [begin, end]", name));
      std::vector<uint64_t> off;
      for (const Json& o : offsets) {
        const int64_t at = int_of(o);
        if (at < 0) throw bad(fmt::format("tensor '{}': a negative data offset", name));
        off.push_back(static_cast<uint64_t>(at));
      }
      double elements = 1;  // in double first: a hostile shape must not overflow
      for (int64_t d : t.shape) elements *= d < 0 ? -1.0 : static_cast<double>(d);
      if (elements < 0 || elements > static_cast<double>(data.size()))
        throw bad(fmt::format("tensor '{}': shape {} does not fit in the file", name, to_string(t.shape)));
      const int64_t count = numel(t.shape);
      const int size = dtype == "F32" ? 4 : (dtype == "BF16" || dtype == "F16") ? 2 : 0;
      if (size == 0) throw bad(fmt::format("tensor '{}' is {}; dlplan reads F32, BF16 and F16", name, dtype));
      if (off.size() != 2 || off[1] < off[0] || off[1] - off[0] != static_cast<uint64_t>(count) * size ||
          base + off[1] > data.size())
        throw bad(fmt::format("tensor '{}': data_offsets do not match its shape or lie outside the file", name));
      t.values.resize(static_cast<size_t>(count));
      const char* p = data.data() + base + off[0];
      for (int64_t i = 0; i < count; ++i) {
        if (size == 4) {
          std::memcpy(&t.values[static_cast<size_t>(i)], p + i * 4, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, p + i * 2, 2);
          uint32_t bits;
          if (dtype == "BF16") {
            bits = static_cast<uint32_t>(h) << 16;
          } else {  // IEEE half to float
            const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
            if (exp == 0) {
              const float f = std::ldexp(static_cast<float>(man), -24);
              std::memcpy(&bits, &f, 4);
              bits |= sign;
            } else if (exp == 31) {
              bits = sign | 0x7f800000u | (man << 13);
            } else {
              bits = sign | ((exp + 112) << 23) | (man << 13);
            }
          }
          std::memcpy(&t.values[static_cast<size_t>(i)], &bits, 4);
        }
      }
      out.push_back(std::move(t));
    } catch (const Json::exception& e) {
      throw bad(fmt::format("tensor '{}': {}", name, e.what()));
    } catch (const Error& e) {  // int_of / shape_of: add the file and the tensor
      if (std::string_view(e.what()).rfind(path, 0) == 0) throw;
      throw bad(fmt::format("tensor '{}': {}", name, e.what()));
    }
  }
  return out;
}

std::vector<NamedTensor> read_init_tensors(const std::string& path, const Model& model) {
  const auto ext = std::filesystem::path(path).extension().string();
  if (ext != ".onnx" && ext != ".ONNX") return read_safetensors(path);
  ImportOptions opt;
  opt.seq_len = tokens_per_sample(model);  // the file's symbolic sequence axis, as the plan's model has it
  // The plan does not say which --fusion imported it, and the two name some
  // parameters differently (an RMSNorm's weight is the fused op's, or the
  // Mul's): take the import whose names are the model's.
  auto names_match = [&](const std::vector<ImportedWeight>& ws) {
    std::set<std::string> names;
    for (const auto& w : ws) names.insert(w.name);
    for (const ParamInfo& p : model.params)
      if (!p.adapter && !names.count(p.name)) return false;
    return true;
  };
  std::vector<ImportedWeight> weights = import_onnx_weights(path, opt);
  if (!names_match(weights)) {  // read again only for a plan the default did not make
    ImportOptions eager = opt;
    eager.fusion = FusionMode::eager;
    if (auto other = import_onnx_weights(path, eager); names_match(other)) weights = std::move(other);
  }
  std::vector<NamedTensor> out;
  for (ImportedWeight& w : weights) out.push_back({w.name, w.shape, std::move(w.values)});
  return out;
}

void set_parameters(Trainer& trainer, const std::vector<NamedTensor>& tensors, const std::string& source) {
  ParamStore& store = trainer.store();
  DeviceOps& ops = store.ops();
  const Model& model = trainer.plan().model;
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t;
  std::set<std::string> used;
  const bool full = !params_sharded(store);
  std::vector<std::vector<float>> units(static_cast<size_t>(store.units())), frozen(units.size());
  for (int u = 0; u < store.units(); ++u) {
    // What the store holds now (this rank's part), so that LoRA adapters the
    // file lacks keep their initial values.
    auto& v = units[static_cast<size_t>(u)];
    v.assign(static_cast<size_t>(store.unit_size(u)), 0.0f);
    if (full) ops.download_floats(v.data(), store.params(u).span().sub(0, store.unit_size(u)));
    else if (store.owned_size(u) > 0) ops.download_floats(v.data() + store.owned_begin(u), store.owned_params(u));
    frozen[static_cast<size_t>(u)].assign(static_cast<size_t>(store.frozen_padded(u)), 0.0f);  // fine-tuning
  }
  for (size_t k = 0; k < model.params.size(); ++k) {
    const ParamInfo& p = model.params[k];
    const auto it = by_name.find(p.name);
    if (it == by_name.end() && p.adapter) continue;  // a base model's weights: the adapters start as initialised
    if (it == by_name.end()) throw Error(fmt::format("{}: has no tensor '{}' (a parameter of model '{}')", source, p.name, model.name));
    const Shape want = p.shape.empty() ? Shape{p.numel} : p.shape;
    if (it->second->shape != want)
      throw Error(fmt::format("{}: tensor '{}' has shape {}, model '{}' expects {}", source, p.name,
                              to_string(it->second->shape), model.name, to_string(want)));
    const auto [u, off] = store.locate(static_cast<int>(k));
    auto& run = store.trainable(static_cast<int>(k)) ? units : frozen;
    std::copy(it->second->values.begin(), it->second->values.end(), run[static_cast<size_t>(u)].begin() + off);
    used.insert(p.name);
  }
  for (const ParamInfo& b : model.buffers) used.insert(b.name);  // running statistics may be present; not loaded
  for (const NamedTensor& t : tensors)
    if (!used.count(t.name))
      throw Error(fmt::format("{}: tensor '{}' is no parameter of model '{}' (weights of another model?)", source, t.name, model.name));
  Optimizer& opt = trainer.optimizer();
  for (int u = 0; u < store.units(); ++u) {
    const auto& v = units[static_cast<size_t>(u)];
    const int64_t ob = store.owned_begin(u), os = store.owned_size(u);
    if (full) ops.upload_floats(store.params(u).span().sub(0, store.unit_size(u)), v.data());
    else if (os > 0) ops.upload_floats(store.owned_params(u), v.data() + ob);
    for (const auto& [name, t] : opt.state(u))
      if (name == "master" && os > 0) ops.upload(t.f(), v.data() + ob, os * 4);
    if (store.frozen_size(u) == 0) continue;  // the frozen run: all of it, or (zero3) this rank's shard
    const auto& f = frozen[static_cast<size_t>(u)];
    if (full) ops.upload_floats(store.frozen(u).span().sub(0, store.frozen_size(u)), f.data());
    else ops.upload_floats(store.frozen(u).span(), f.data() + static_cast<int64_t>(store.rank()) * store.frozen_shard(u));
  }
  ops.synchronize();
}

}  // namespace dlplan::exec
