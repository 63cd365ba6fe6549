// Recomputes off the UI thread. Every request() bumps a generation counter;
// a job whose generation is no longer the latest is dropped when it finishes.
// At most one job runs; requests arriving meanwhile coalesce into one pending
// job (the newest inputs win). A job computes the plan and simulations first
// (resultsReady), then, unless a newer request is waiting, the GPU-count sweep
// (sweepReady).
#pragma once

#include "engine.hpp"

#include <QFutureWatcher>
#include <QObject>
#include <QString>

#include <memory>
#include <optional>
#include <variant>

namespace dlplan::gui {

class Recomputer : public QObject {
  Q_OBJECT

 public:
  explicit Recomputer(QObject* parent = nullptr);
  ~Recomputer() override;

  // Schedules a recompute for `in`; returns its generation.
  quint64 request(const Inputs& in);
  quint64 generation() const { return generation_; }
  bool busy() const { return running_ || pending_.has_value(); }
  void setSweepEnabled(bool on) { sweepEnabled_ = on; }

  std::shared_ptr<const Results> results() const { return results_; }  // the latest delivered
  std::shared_ptr<const Sweep> sweep() const { return sweep_; }
  Engine& engine() { return *engine_; }

 signals:
  void resultsReady(quint64 generation);
  void sweepReady(quint64 generation);
  void failed(quint64 generation, const QString& message, const dlplan::gui::Inputs& inputs);
  void idle();

 private:
  struct Job {
    Inputs inputs;
    quint64 generation = 0;
    bool sweep = false;
  };
  using Outcome = std::variant<std::shared_ptr<const Results>, std::shared_ptr<const Sweep>, std::string>;

  void startNext();
  void finished();

  std::shared_ptr<Engine> engine_ = std::make_shared<Engine>();
  quint64 generation_ = 0;
  bool running_ = false;
  bool sweepEnabled_ = true;
  Job current_;
  std::optional<Job> pending_;
  QFutureWatcher<Outcome> watcher_;
  std::shared_ptr<const Results> results_;
  std::shared_ptr<const Sweep> sweep_;
};

}  // namespace dlplan::gui
